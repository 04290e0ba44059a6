"""Well-level profiles and a handcrafted baseline (pure: arrays and tables in, numbers out).

* ``well_profiles``: the mean of a well's field embeddings, then JUMP's profiling recipe for
  learned features (``recipe.py``: per plate a robust z-score against the negative-control
  wells, a rank-based inverse normal transform, feature selection, sphering where the controls
  allow); the retrieval mAP of the profiles is ``retrieval.py``'s;
* ``handcrafted_features``: a documented CellProfiler-style baseline when ``cp-measure`` is not
  installed: per channel intensity mean, spread and percentiles, the foreground share and the
  mean gradient, and on the first channel (DNA) the nuclei count and mean area
  (connected components above the field's mean + 1 sd).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np
import numpy.typing as npt

from octtrain.eval.cellpainting.recipe import RecipeConfig, RecipeResult, apply_recipe

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class WellKey:
    plate: str
    well: str
    perturbation: str
    is_control: bool


def well_means(embeddings: Array, keys: Sequence[WellKey]) -> tuple[Array, list[WellKey]]:
    """The mean field embedding of each well, wells in order of first appearance."""
    order: dict[WellKey, list[int]] = {}
    for i, k in enumerate(keys):
        order.setdefault(k, []).append(i)
    x = np.asarray(embeddings, np.float64)
    return np.stack([x[idx].mean(axis=0) for idx in order.values()]), list(order)


def recipe_profiles(
    embeddings: Array, keys: Sequence[WellKey], cfg: RecipeConfig | None = None
) -> tuple[RecipeResult, list[WellKey]]:
    """``well_means`` through JUMP's recipe (``recipe.apply_recipe``), with what it kept."""
    x, wells = well_means(embeddings, keys)
    controls = np.array([w.is_control for w in wells], dtype=bool)
    return apply_recipe(x, [w.plate for w in wells], controls, cfg), wells


def well_profiles(
    embeddings: Array, keys: Sequence[WellKey], cfg: RecipeConfig | None = None
) -> tuple[Array, list[WellKey]]:
    """Well profiles ``[wells, kept features]`` after JUMP's recipe, and their wells."""
    result, wells = recipe_profiles(embeddings, keys, cfg)
    return result.profiles, wells


def handcrafted_features(field: npt.NDArray[np.uint8]) -> Array:
    """CellProfiler-style features of one uint8 field ``[C, Y, X]`` (see the module docstring)."""
    feats: list[float] = []
    for channel in field.astype(np.float64):
        fg = channel > channel.mean() + channel.std()
        gy, gx = np.gradient(channel)
        feats += [
            channel.mean(),
            channel.std(),
            *np.percentile(channel, [10, 50, 90]),
            fg.mean(),
            float(np.hypot(gy, gx).mean()),
        ]
    dna = field[0].astype(np.float64)
    mask = (dna > dna.mean() + dna.std()).astype(np.uint8)
    n, _, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
    areas = stats[1:, cv2.CC_STAT_AREA]
    feats += [float(n - 1), float(areas.mean()) if len(areas) else 0.0]
    return np.asarray(feats, dtype=np.float64)
