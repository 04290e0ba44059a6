"""iBOT masks as DINOv2 draws them: blocks, on half of a batch's global crops, at stratified
ratios, gathered through a fixed-size index list."""

from __future__ import annotations

import numpy as np
import torch

from octtrain.data.ibot_masks import (
    IbotCollate,
    MaskingGenerator,
    batch_masks,
    index_budget,
    mask_index,
)

GRID = (8, 8)  # the tiny config: 32 px global crops, patch 4


def _neighbour_share(mask: np.ndarray) -> float:
    """Share of masked patches with a masked 4-neighbour (1 for blocks, low when scattered)."""
    padded = np.pad(mask, 1)
    near = padded[:-2, 1:-1] | padded[2:, 1:-1] | padded[1:-1, :-2] | padded[1:-1, 2:]
    return float((mask & near).sum() / max(1, mask.sum()))


def test_block_masks_are_blocks_of_about_the_asked_count() -> None:
    rng = np.random.default_rng(0)
    gen = MaskingGenerator((14, 14))
    for count in (20, 50, 90):
        mask = gen(rng, count)
        assert mask.shape == (14, 14)
        assert 0.6 * count <= mask.sum() <= count  # DINOv2 stops when no block fits
        assert _neighbour_share(mask) > 0.9


def test_half_the_crops_are_masked_at_stratified_ratios() -> None:
    rng = np.random.default_rng(1)
    gen = MaskingGenerator(GRID)
    n = GRID[0] * GRID[1]
    for _ in range(20):
        masks = batch_masks(rng, 16, gen, 0.5, (0.1, 0.5))
        counts = masks.sum(axis=1)
        assert (counts > 0).sum() == 8 and (counts == 0).sum() == 8  # exactly half
        ratios = np.sort(counts[counts > 0]) / n
        # One crop per slice of [0.1, 0.5]: the masked ratios spread over the whole range.
        assert ratios[-1] > 0.3 and ratios[0] <= 0.15
        assert counts.sum() <= index_budget(16, n, 0.5, (0.1, 0.5))
    # No two batches mask the same crops: the masked crops are shuffled.
    first = batch_masks(rng, 16, gen, 0.5, (0.1, 0.5)).any(axis=1)
    assert any(
        not np.array_equal(first, batch_masks(rng, 16, gen, 0.5, (0.1, 0.5)).any(axis=1))
        for _ in range(5)
    )


def test_the_collated_batch_carries_a_fixed_size_index_list_matching_its_masks() -> None:
    collate = IbotCollate(GRID, 0.5, (0.1, 0.5))
    items = [
        {"global": torch.zeros(2, 1, 4, 4, dtype=torch.uint8), "mask_seed": s, "index": i}
        for i, s in enumerate([11, 12, 13, 14])
    ]
    batch = collate(items)
    again = collate(items)
    assert torch.equal(batch["masks"], again["masks"])  # keyed by the items' seeds
    masks = batch["masks"]  # [B, 2, N], item-major as to_views expects
    assert masks.shape == (4, 2, 64) and int(masks.any(dim=2).sum()) == 4
    crop_major = masks.transpose(0, 1).reshape(8, 64)
    budget = index_budget(8, 64, 0.5, (0.1, 0.5))
    index, weight = batch["mask_index"], batch["mask_weight"]
    assert index.shape == (budget,) and weight.shape == (budget,)
    m = int(crop_major.sum())
    assert torch.equal(index[:m], crop_major.flatten().nonzero().flatten())
    assert torch.all(weight[m:] == 0)
    # Each masked crop's weights sum to 1 (DINOv2's 1 / n_masked per image).
    per_crop = torch.zeros(8).index_add_(0, index[:m] // 64, weight[:m])
    assert torch.allclose(per_crop[crop_major.any(dim=1)], torch.ones(4))


def test_mask_index_refuses_more_tokens_than_its_budget() -> None:
    masks = np.ones((2, 4), dtype=bool)
    try:
        mask_index(masks, 7)
    except ValueError as exc:
        assert "exceed the index budget 7" in str(exc)
    else:
        raise AssertionError("8 masked tokens fitted a budget of 7")
