"""iBOT masks as DINOv2 draws them, per batch in the loader workers (pure: numpy RNG in).

DINOv2 (``dinov2/data/masking.py``, ``collate.py``) masks rectangular blocks of the patch grid
(``MaskingGenerator``: blocks of at least 4 patches, aspect ratio in [0.3, 3.3], added until the
crop's target count is reached or no block fits), and only on a share ``mask_probability`` of a
batch's global crops; the masked crops' ratios are stratified over ``mask_ratio`` (crop ``i`` of
``n`` masked draws its ratio in the ``i``-th of ``n`` equal slices) and the crops are shuffled.
Scattered single patches are easy to fill in from their neighbours; blocks make iBOT predict
content the crop does not show next to the gap.

The step gathers the masked patch tokens through a fixed-size index list: ``mask_index [M]``
(flat positions in the crop-major ``[2B * N]`` patch tokens) and ``mask_weight [M]`` (each masked
token ``1 / masked tokens of its crop``, 0 on the padding), ``M = index_budget(...)`` fixed by the
batch size, grid and ratios alone. The shapes never change from step to step, so the step has no
data-dependent shape: no host sync, no recompilation, no graph break under ``torch.compile``.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate


class MaskingGenerator:
    """DINOv2's block mask generator over a ``grid`` of patches."""

    def __init__(
        self,
        grid: tuple[int, int],
        max_patches: int | None = None,
        min_patches: int = 4,
        aspect: tuple[float, float] = (0.3, 1 / 0.3),
    ) -> None:
        self.height, self.width = grid
        self.max_patches = max_patches or self.height * self.width // 2
        self.min_patches = min_patches
        self.log_aspect = (math.log(aspect[0]), math.log(aspect[1]))

    def _block(self, mask: np.ndarray, budget: int, rng: np.random.Generator) -> int:
        """Mask one block adding between 1 and ``budget`` patches (10 tries); how many it added."""
        for _ in range(10):
            # Python's random.uniform, as DINOv2 draws it: between the two even when the
            # budget is below the minimum block (numpy's uniform refuses high < low).
            area = self.min_patches + (budget - self.min_patches) * rng.random()
            aspect = math.exp(rng.uniform(*self.log_aspect))
            h = round(math.sqrt(area * aspect))
            w = round(math.sqrt(area / aspect))
            if w < self.width and h < self.height:
                top = int(rng.integers(0, self.height - h + 1))
                left = int(rng.integers(0, self.width - w + 1))
                region = mask[top : top + h, left : left + w]
                added = h * w - int(region.sum())
                if 0 < added <= budget:
                    region[...] = True
                    return added
        return 0

    def __call__(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """A ``[height, width]`` bool mask of at most ``count`` patches, made of blocks."""
        mask = np.zeros((self.height, self.width), dtype=bool)
        done = 0
        while done < count:
            added = self._block(mask, min(count - done, self.max_patches), rng)
            if added == 0:
                break
            done += added
        return mask


def _bounds(crops: int, probability: float, ratio: tuple[float, float]) -> np.ndarray:
    """The stratified ratio slices' edges: ``int(crops * probability)`` masked crops."""
    return np.linspace(ratio[0], ratio[1], int(crops * probability) + 1)


def batch_masks(
    rng: np.random.Generator,
    crops: int,
    generator: MaskingGenerator,
    probability: float,
    ratio: tuple[float, float],
) -> np.ndarray:
    """``[crops, N]`` bool: ``int(crops * probability)`` crops get block masks at stratified
    ratios, the others none, in a random order (DINOv2's ``collate_data_and_cast``)."""
    n = generator.height * generator.width
    edges = _bounds(crops, probability, ratio)
    masks = [
        generator(rng, int(n * rng.uniform(lo, hi))).reshape(-1)
        for lo, hi in itertools.pairwise(edges)
    ]
    masks += [np.zeros(n, dtype=bool)] * (crops - len(masks))
    return np.stack(masks)[rng.permutation(crops)]


def index_budget(crops: int, patches: int, probability: float, ratio: tuple[float, float]) -> int:
    """The most masked tokens ``batch_masks`` can draw for ``crops`` crops (DINOv2's
    ``upperbound``): the length of every step's index list."""
    return sum(int(patches * hi) for hi in _bounds(crops, probability, ratio)[1:])


def mask_index(masks: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """``(mask_index [budget] int64, mask_weight [budget] float32)`` of crop-major ``masks
    [crops, N]``: the masked tokens' flat positions, each weighted ``1 / its crop's count``,
    padded with position 0 at weight 0."""
    flat = np.flatnonzero(masks)
    if len(flat) > budget:
        raise ValueError(f"{len(flat)} masked tokens exceed the index budget {budget}")
    counts = masks.sum(axis=1)
    index = np.zeros(budget, dtype=np.int64)
    weight = np.zeros(budget, dtype=np.float32)
    index[: len(flat)] = flat
    weight[: len(flat)] = 1.0 / counts[flat // masks.shape[1]]
    return index, weight


class IbotCollate:
    """The loader's ``collate_fn``: stacks the items and adds the batch's iBOT masks
    ``masks [B, 2, N]`` (item-major, as ``to_views`` expects) with ``mask_index`` and
    ``mask_weight`` over the crop-major tokens. The RNG is seeded from the items' ``mask_seed``
    (keyed by the sampler's seeds): the same batch gets the same masks on any host, on resume."""

    def __init__(self, grid: tuple[int, int], probability: float, ratio: tuple[float, float]):
        self.generator = MaskingGenerator(grid)
        self.probability, self.ratio = probability, ratio
        self.patches = grid[0] * grid[1]

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        seeds = [int(item["mask_seed"]) for item in items]
        batch: dict[str, Any] = default_collate(
            [{k: v for k, v in item.items() if k != "mask_seed"} for item in items]
        )
        b, n_global = len(items), 2
        crops = n_global * b
        masks = batch_masks(
            np.random.default_rng(seeds), crops, self.generator, self.probability, self.ratio
        )
        budget = index_budget(crops, self.patches, self.probability, self.ratio)
        index, weight = mask_index(masks, budget)
        item_major = masks.reshape(n_global, b, self.patches).transpose(1, 0, 2)
        batch["masks"] = torch.from_numpy(np.ascontiguousarray(item_major))
        batch["mask_index"] = torch.from_numpy(index)
        batch["mask_weight"] = torch.from_numpy(weight)
        return batch
