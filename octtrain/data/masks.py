"""Multi-block 3D masks with a fixed number of masked patches (pure: numpy RNG in, arrays out).

V-JEPA masks several random blocks of the patch grid, tubes through the whole temporal axis,
from two generators (short-range: small blocks; long-range: large ones), and predicts them from
the rest. Here the depth (B-scan) axis plays time: blocks run through every B-scan by default,
each sample's mask comes from one of the two generators, and blocks are drawn one after another
until exactly ``K = round(ratio * N)`` patches are masked (the last block is cut column by
column), so every batch has the same shapes: ``context [B, N - K]`` and ``target [B, K]`` index
tensors. Static shapes keep XLA from recompiling and let the whole batch go through the encoder
at once. ``SampleMasker`` draws one sample's masks in a loader worker.
"""

from __future__ import annotations

import math

import numpy as np

from octtrain.config.pretrain import MaskConfig


def num_masked(num_patches: int, ratio: float) -> int:
    """K: masked patches per sample, at least 1 and leaving at least 1 patch of context."""
    return min(num_patches - 1, max(1, round(ratio * num_patches)))


def sample_block_mask(
    grid: tuple[int, int, int], k: int, cfg: MaskConfig, rng: np.random.Generator
) -> np.ndarray:
    """A boolean grid with exactly ``k`` True (masked) patches, made of 3D blocks."""
    gd, gh, gw = grid
    masked = np.zeros(grid, dtype=bool)
    count = 0
    scale = cfg.long_scale if rng.random() < cfg.long_share else cfg.short_scale
    while count < k:
        area = rng.uniform(*scale) * gh * gw
        aspect = math.exp(rng.uniform(math.log(cfg.aspect_ratio[0]), math.log(cfg.aspect_ratio[1])))
        bh = min(gh, max(1, round(math.sqrt(area * aspect))))
        bw = min(gw, max(1, round(math.sqrt(area / aspect))))
        bd = min(gd, max(1, round(rng.uniform(*cfg.depth_scale) * gd)))
        d0 = int(rng.integers(0, gd - bd + 1))
        h0 = int(rng.integers(0, gh - bh + 1))
        w0 = int(rng.integers(0, gw - bw + 1))
        block = np.zeros(grid, dtype=bool)
        block[d0 : d0 + bd, h0 : h0 + bh, w0 : w0 + bw] = True
        # Cut the last block column by column (all depths of one (h, w) before the next), so
        # at most one column is masked in only some B-scans.
        hh, ww, dd = np.nonzero((block & ~masked).transpose(1, 2, 0))
        new = np.ravel_multi_index((dd, hh, ww), grid)[: k - count]
        masked.flat[new] = True
        count += len(new)
    return masked


def copy_shortcut_share(masked: np.ndarray) -> float:
    """Share of masked patches whose (h, w) position is visible in another depth layer of the
    same sample: what the predictor could copy instead of infer. ``masked [D, H, W]`` bool."""
    total = int(masked.sum())
    if total == 0:
        return 0.0
    visible_somewhere = np.any(~masked, axis=0, keepdims=True)  # [1, H, W]: seen in some layer
    return float((masked & visible_somewhere).sum() / total)


class SampleMasker:
    """One sample's masks, drawn in the loader workers: ``masker(rng)`` returns the context and
    target patch indices, ``[N - K]`` and ``[K]``, int32 (a quarter of int64's bytes on the wire;
    the step widens them for ``gather``). A pure function of ``rng``'s seed."""

    def __init__(self, grid: tuple[int, int, int], cfg: MaskConfig) -> None:
        self.grid, self.cfg = grid, cfg
        self.n = grid[0] * grid[1] * grid[2]
        self.k = num_masked(self.n, cfg.ratio)

    def __call__(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        mask = sample_block_mask(self.grid, self.k, self.cfg, rng).reshape(-1)
        order = np.argsort(mask, kind="stable").astype(np.int32)  # unmasked first, ascending
        return order[: self.n - self.k], order[self.n - self.k :]


def mask_overlay(
    volume: np.ndarray,
    target_idx: np.ndarray,
    grid: tuple[int, int, int],
    patch: tuple[int, int, int],
    max_slices: int = 8,
) -> np.ndarray:
    """RGB uint8 strip of B-scans (one per patch layer, centre slice) with masked patches in red.

    ``volume [D, H, W]`` is in [-1, 1]; ``target_idx`` are the masked patch indices.
    """
    masked = np.zeros(grid[0] * grid[1] * grid[2], dtype=bool)
    masked[target_idx] = True
    masked = masked.reshape(grid)
    tiles = []
    for layer in range(min(grid[0], max_slices)):
        grey = np.clip((volume[layer * patch[0] + patch[0] // 2] + 1.0) * 127.5, 0, 255)
        rgb = np.repeat(grey[..., None], 3, axis=2)
        cover = np.kron(masked[layer], np.ones(patch[1:], dtype=bool))
        rgb[cover] = 0.5 * rgb[cover] + np.array([127.0, 0.0, 0.0])
        tiles.append(rgb.astype(np.uint8))
    return np.concatenate(tiles, axis=1)
