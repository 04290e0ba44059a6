"""Masks: exactly K masked patches per sample, context and target partition the grid, blocky."""

from __future__ import annotations

import numpy as np
import pytest

from octtrain.config.pretrain import MaskConfig
from octtrain.data.masks import (
    SampleMasker,
    copy_shortcut_share,
    mask_overlay,
    num_masked,
    sample_block_mask,
)

GRID = (4, 6, 6)


@pytest.mark.parametrize("ratio", [0.1, 0.5, 0.75, 0.9])
def test_every_sample_has_exactly_k_targets_and_the_rest_as_context(ratio: float) -> None:
    n = GRID[0] * GRID[1] * GRID[2]
    k = num_masked(n, ratio)
    masker = SampleMasker(GRID, MaskConfig(ratio=ratio))
    for seed in range(16):
        context, target = masker(np.random.default_rng(seed))
        assert context.shape == (n - k,) and target.shape == (k,)
        assert context.dtype == target.dtype == np.int32
        assert sorted(np.concatenate([context, target]).tolist()) == list(range(n))
        assert np.all(context[1:] > context[:-1]) and np.all(target[1:] > target[:-1])


def test_k_leaves_context_and_masks_something() -> None:
    assert num_masked(8, 0.99) == 7
    assert num_masked(8, 0.01) == 1


def test_the_same_seed_gives_the_same_mask_another_seed_another() -> None:
    masker = SampleMasker(GRID, MaskConfig())
    a, b, c = (masker(np.random.default_rng(s))[1] for s in (7, 7, 8))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def _masked_neighbour_share(mask: np.ndarray) -> float:
    """Share of masked patches' in-plane neighbours that are masked too."""
    same = total = 0
    for axis in (1, 2):
        a = np.swapaxes(mask, 0, axis)
        pairs = a[1:] & a[:-1]
        same += 2 * int(pairs.sum())
        total += int((a[1:] | a[:-1]).sum() + (a[1:] & a[:-1]).sum())
    return same / total


def test_masks_are_blocks_not_scattered_patches() -> None:
    rng = np.random.default_rng(1)
    n = GRID[0] * GRID[1] * GRID[2]
    k = num_masked(n, 0.5)
    block = np.mean(
        [
            _masked_neighbour_share(sample_block_mask(GRID, k, MaskConfig(0.5), rng))
            for _ in range(50)
        ]
    )
    scattered = []
    for _ in range(50):
        m = np.zeros(n, dtype=bool)
        m[rng.choice(n, k, replace=False)] = True
        scattered.append(_masked_neighbour_share(m.reshape(GRID)))
    assert block > np.mean(scattered) + 0.15


def test_mask_overlay_marks_masked_patches_red() -> None:
    volume = np.zeros((8, 16, 16), dtype=np.float32)  # grey 127
    image = mask_overlay(volume, np.array([0]), (2, 2, 2), (4, 8, 8))
    assert image.shape == (16, 32, 3) and image.dtype == np.uint8
    assert image[0, 0, 0] > image[0, 0, 1]  # masked patch: red tint
    assert image[0, 8, 0] == image[0, 8, 1]  # unmasked: grey


def test_default_masks_leave_no_copy_shortcut_across_b_scans() -> None:
    # The users' grid at 64x384x384 with patch [4,16,16]: 16 B-scan layers of 24 x 24 patches.
    grid, rng = (16, 24, 24), np.random.default_rng(0)
    k = num_masked(16 * 24 * 24, 0.75)

    def share(cfg: MaskConfig) -> float:
        return float(
            np.mean([copy_shortcut_share(sample_block_mask(grid, k, cfg, rng)) for _ in range(40)])
        )

    old = MaskConfig(depth_scale=(0.5, 1.0))  # the former default: blocks through some B-scans
    assert share(old) > 0.3  # the reported 52%
    assert share(MaskConfig()) < 0.01  # tubes: at most one column cut short per sample


def test_both_mask_generators_are_used_with_their_own_scales() -> None:
    grid, rng = (4, 24, 24), np.random.default_rng(0)
    k = num_masked(4 * 24 * 24, 0.5)
    only_short = MaskConfig(0.5, long_share=0.0)
    only_long = MaskConfig(0.5, long_share=1.0)

    def edge(cfg: MaskConfig) -> float:
        """Masked/visible borders per masked patch in the first layer (smaller blocks: more)."""
        values = []
        for _ in range(30):
            m = sample_block_mask(grid, k, cfg, rng)[0]
            borders = (m[1:] != m[:-1]).sum() + (m[:, 1:] != m[:, :-1]).sum()
            values.append(borders / m.sum())
        return float(np.mean(values))

    assert edge(only_short) > 1.3 * edge(only_long)
