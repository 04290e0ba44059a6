"""Retrieval mAP of well profiles with ``copairs`` (the JUMP consortium's tool) and its bootstrap
intervals (pure: arrays and tables in, numbers out).

* *phenotypic activity*: does a perturbation's replicate wells retrieve each other before the
  negative-control wells (one AP per treated well, cosine similarity);
* *phenotypic distinctiveness*: do they retrieve each other before other perturbations' wells
  (treated wells only). The code called this "consistency" before; JUMP's papers call it
  distinctiveness (their "consistency" is retrieval of perturbations sharing a target or
  pathway, which the twin has no annotation for), so the keys are ``distinctiveness_*`` now.

Each is reported as the mean over perturbations of the perturbation's mean AP (copairs'
``mean_average_precision``), the share of perturbations retrieved at p < 0.05 (its permutation
test, FDR-corrected), and a 95% bootstrap interval of the mAP. The bootstrap resamples the
units the evidence comes in, not AP rows: perturbations with replacement, then within each
drawn perturbation its wells with replacement (a two-stage cluster bootstrap, as the participant
bootstrap of ``bootstrap.py`` resamples participants, not volumes). The per-well APs are computed
once on all wells and resampled, not recomputed: a well drawn twice would otherwise retrieve its
own copy. ``paired_difference`` draws the same perturbations and wells for two encoders scored on
the same wells, so the interval of their difference accounts for what they share.
"""

from __future__ import annotations

import importlib.util
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from octtrain.errors import ConfigError
from octtrain.eval.cellpainting.profiles import Array, WellKey
from octtrain.eval.common.bootstrap import Interval

# copairs logs each stage of every mAP at INFO ("Computing null_dist..."): noise in a training
# run's log, which validates with it every validation.every steps.
logging.getLogger("copairs").setLevel(logging.WARNING)

KINDS = ("activity", "distinctiveness")
RESAMPLES = 1000


@dataclass(frozen=True)
class Retrieval:
    """One encoder's per-well APs (``plate``, ``well``, ``perturbation``, ``average_precision``;
    None where nothing could be ranked) and mAP summaries, per kind."""

    aps: dict[str, pd.DataFrame | None]
    maps: dict[str, float]  # <kind>_map, <kind>_retrieved


def require_copairs(what: str) -> None:
    """Refuse before training, not at the first validation thousands of steps in, when copairs
    (imported only where it scores) is not installed; ``what``: the setting that asks for it."""
    if importlib.util.find_spec("copairs") is None:
        raise ConfigError(
            f"{what} scores well profiles with copairs, which is not installed in this "
            "environment (pip install 'copairs>=0.5', as the package requires), or set "
            "validation.every=0"
        )


def _meta(wells: Sequence[WellKey]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "plate": [w.plate for w in wells],
            "well": [w.well for w in wells],
            "perturbation": [w.perturbation for w in wells],
            "is_control": [w.is_control for w in wells],
        }
    )


def _aps(meta: pd.DataFrame, x: Array, neg_diffby: list[str]) -> pd.DataFrame | None:
    """Per treated well AP, sorted by (perturbation, plate, well); None when none is defined."""
    from copairs.map import average_precision
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
        return None
    ap = ap[~ap["is_control"]].dropna(subset=["average_precision"])
    if ap.empty:
        return None
    return ap.sort_values(["perturbation", "plate", "well"]).reset_index(drop=True)


def _summary(ap: pd.DataFrame | None) -> tuple[float, float]:
    from copairs.map import mean_average_precision

    if ap is None:
        return math.nan, math.nan
    maps = mean_average_precision(
        ap, sameby=["perturbation"], null_size=1000, threshold=0.05, seed=0, progress_bar=False
    )
    return float(maps["mean_average_precision"].mean()), float(maps["below_corrected_p"].mean())


def retrieval(profiles: Array, wells: Sequence[WellKey]) -> Retrieval:
    """Activity and distinctiveness APs and mAPs of well ``profiles`` (module docstring)."""
    meta = _meta(wells)
    aps: dict[str, pd.DataFrame | None] = {"activity": _aps(meta, profiles, ["is_control"])}
    treated = ~meta["is_control"].to_numpy()
    aps["distinctiveness"] = (
        _aps(meta[treated].reset_index(drop=True), profiles[treated], ["perturbation"])
        if len(set(meta["perturbation"][treated])) > 1
        else None
    )
    maps = {}
    for kind, ap in aps.items():
        maps[f"{kind}_map"], maps[f"{kind}_retrieved"] = _summary(ap)
    return Retrieval(aps, maps)


def retrieval_map(profiles: Array, wells: Sequence[WellKey]) -> dict[str, float]:
    """Phenotypic activity (vs controls) and distinctiveness (vs other perturbations) mAP."""
    return retrieval(profiles, wells).maps


def ap_groups(ap: pd.DataFrame) -> list[npt.NDArray[np.float64]]:
    """Each perturbation's per-well APs, perturbations in sorted order."""
    return [
        g["average_precision"].to_numpy(np.float64)
        for _, g in ap.groupby("perturbation", sort=True)
    ]


Draw = list[tuple[int, npt.NDArray[np.int64]]]  # (perturbation, its wells drawn)


def draws(sizes: Sequence[int], resamples: int, seed: int) -> list[Draw]:
    """``resamples`` two-stage draws: perturbations with replacement, then each drawn
    perturbation's wells (``sizes[k]`` of them) with replacement."""
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    rng = np.random.default_rng([seed, 25])
    out = []
    for _ in range(resamples):
        picks = rng.integers(0, len(sizes), size=len(sizes))
        out.append([(int(k), rng.integers(0, sizes[k], size=sizes[k])) for k in picks])
    return out


def resampled_maps(groups: Sequence[npt.NDArray[np.float64]], drawn: Sequence[Draw]) -> Array:
    """The mAP (mean over drawn perturbations of their drawn wells' mean AP) of each draw."""
    return np.array([np.mean([groups[k][w].mean() for k, w in d]) for d in drawn])


def percentile_interval(value: float, samples: Array, confidence: float = 0.95) -> Interval:
    """``value`` with the percentile interval of ``samples`` (nan where there are none)."""
    finite = samples[np.isfinite(samples)]
    if finite.size == 0 or math.isnan(value):
        return Interval(value, math.nan, math.nan, len(samples), int(finite.size))
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(finite, [tail, 100.0 - tail])
    return Interval(value, float(low), float(high), len(samples), int(finite.size))


def map_interval(ap: pd.DataFrame | None, resamples: int = RESAMPLES, seed: int = 0) -> Interval:
    """The mAP (mean of per-perturbation mean APs) with its two-stage bootstrap interval."""
    if ap is None:
        return Interval(math.nan, math.nan, math.nan, resamples, 0)
    groups = ap_groups(ap)
    value = float(np.mean([g.mean() for g in groups]))
    drawn = draws([len(g) for g in groups], resamples, seed)
    return percentile_interval(value, resampled_maps(groups, drawn))


def _keys(ap: pd.DataFrame) -> list[tuple[str, str, str]]:
    return list(zip(ap["perturbation"], ap["plate"], ap["well"], strict=True))


def paired_difference(
    a: pd.DataFrame | None, b: pd.DataFrame | None, resamples: int = RESAMPLES, seed: int = 0
) -> Interval:
    """mAP(a) - mAP(b) with its interval from the same draws for both (they must be APs of the
    same wells: two encoders' profiles of one set of fields)."""
    if a is None or b is None:
        return Interval(math.nan, math.nan, math.nan, resamples, 0)
    if _keys(a) != _keys(b):
        raise ValueError("paired_difference needs the APs of the same wells for both encoders")
    ga, gb = ap_groups(a), ap_groups(b)
    value = float(np.mean([g.mean() for g in ga]) - np.mean([g.mean() for g in gb]))
    drawn = draws([len(g) for g in ga], resamples, seed)
    return percentile_interval(value, resampled_maps(ga, drawn) - resampled_maps(gb, drawn))
