"""Well-level profiles and the field's retrieval metrics (pure: arrays and tables in, numbers out).

* ``well_profiles``: the mean of a well's field embeddings, then per plate the control wells'
  mean subtracted and each feature divided by the plate's spread (the usual normalisation
  against negative controls, which removes plate effects);
* ``retrieval_map``: mean average precision with ``copairs`` (the JUMP consortium's tool):
  *phenotypic activity*, does a perturbation's replicate wells retrieve each other before the
  control wells, and *consistency*, do they retrieve each other before other perturbations'
  wells; reported as the mean mAP over perturbations and the share retrieved at p < 0.05
  (copairs' permutation test, FDR-corrected);
* ``handcrafted_features``: a documented CellProfiler-style baseline when ``cp-measure`` is not
  installed: per channel intensity mean, spread and percentiles, the foreground share and the
  mean gradient, and on the first channel (DNA) the nuclei count and mean area
  (connected components above the field's mean + 1 sd).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np
import numpy.typing as npt
import pandas as pd

# copairs logs each stage of every mAP at INFO ("Computing null_dist..."): noise in a training
# run's log, which validates with it every validation.every steps.
logging.getLogger("copairs").setLevel(logging.WARNING)

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class WellKey:
    plate: str
    well: str
    perturbation: str
    is_control: bool


def well_profiles(embeddings: Array, keys: Sequence[WellKey]) -> tuple[Array, list[WellKey]]:
    """Mean field embedding per well, normalised per plate against its control wells."""
    order: dict[WellKey, list[int]] = {}
    for i, k in enumerate(keys):
        order.setdefault(k, []).append(i)
    wells = list(order)
    x = np.stack([np.asarray(embeddings, np.float64)[idx].mean(axis=0) for idx in order.values()])
    for plate in {w.plate for w in wells}:
        rows = np.array([w.plate == plate for w in wells])
        controls = rows & np.array([w.is_control for w in wells])
        centre = x[controls].mean(axis=0) if controls.any() else x[rows].mean(axis=0)
        spread = x[rows].std(axis=0) + 1e-6
        x[rows] = (x[rows] - centre) / spread
    return x, wells


def _map(
    meta: pd.DataFrame, x: Array, neg_diffby: list[str], treated_only: bool
) -> dict[str, float]:
    from copairs.map import average_precision, mean_average_precision
    from copairs.matching import UnpairedException

    try:
        ap = average_precision(
            meta,
            x,
            pos_sameby=["perturbation"],
            pos_diffby=[],
            neg_sameby=[],
            neg_diffby=neg_diffby,
            progress_bar=False,
        )
    except UnpairedException:  # no replicate well, or nothing to rank against: no mAP
        return {"map": math.nan, "retrieved": math.nan}
    if treated_only:
        ap = ap[~ap["is_control"]]
    ap = ap.dropna(subset=["average_precision"])
    if ap.empty:
        return {"map": math.nan, "retrieved": math.nan}
    maps = mean_average_precision(
        ap, sameby=["perturbation"], null_size=1000, threshold=0.05, seed=0, progress_bar=False
    )
    return {
        "map": float(maps["mean_average_precision"].mean()),
        "retrieved": float(maps["below_corrected_p"].mean()),
    }


def retrieval_map(profiles: Array, wells: Sequence[WellKey]) -> dict[str, float]:
    """Phenotypic activity (vs controls) and consistency (vs other perturbations) mAP."""
    meta = pd.DataFrame(
        {
            "plate": [w.plate for w in wells],
            "well": [w.well for w in wells],
            "perturbation": [w.perturbation for w in wells],
            "is_control": [w.is_control for w in wells],
        }
    )
    activity = _map(meta, profiles, ["is_control"], treated_only=True)
    treated = ~meta["is_control"].to_numpy()
    if len(set(meta["perturbation"][treated])) > 1:
        consistency = _map(
            meta[treated].reset_index(drop=True), profiles[treated], ["perturbation"], True
        )
    else:
        consistency = {"map": math.nan, "retrieved": math.nan}
    return {
        "activity_map": activity["map"],
        "activity_retrieved": activity["retrieved"],
        "consistency_map": consistency["map"],
        "consistency_retrieved": consistency["retrieved"],
    }


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
