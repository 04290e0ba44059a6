"""Retrieval mAP of well profiles with ``copairs`` (the JUMP consortium's tool) and its bootstrap
intervals (pure: arrays and tables in, numbers out).

* *phenotypic activity*: does a perturbation's replicate wells retrieve each other before the
  negative-control wells (one AP per treated well, cosine similarity);
* *phenotypic distinctiveness*: do they retrieve each other before other perturbations' wells
  (treated wells only). The code called this "consistency" before; JUMP's papers call it
  distinctiveness (their "consistency" is retrieval of perturbations sharing a target or
  pathway, which the twin has no annotation for), so the keys are ``distinctiveness_*`` now.

Activity ranks a treated well's replicates (its perturbation's other wells, any plate) against
the control wells of its own plate, distinctiveness against the other perturbations' wells of
its own plate, as JUMP runs copairs (``neg_sameby`` the plate for both: jump-profiling-recipe's
``average_precision_negcon`` and ``average_precision_nonrep``). Each is reported as the mean over
perturbations of the perturbation's mean AP (copairs' ``mean_average_precision``) and the share
of perturbations retrieved at p < 0.05 (its permutation test with a null of ``NULL_SIZE``,
FDR-corrected). The bootstrap intervals, which resample plates, control wells, perturbations
and wells, are ``resample.py``'s.
"""

from __future__ import annotations

import importlib.util
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from octtrain.errors import ConfigError
from octtrain.eval.cellpainting.profiles import Array, WellKey

# copairs logs each stage of every mAP at INFO ("Computing null_dist..."): noise in a training
# run's log, which validates with it every validation.every steps.
logging.getLogger("copairs").setLevel(logging.WARNING)

KINDS = ("activity", "distinctiveness")
NULL_SIZE = 10_000  # copairs' permutation null per (positives, negatives) count, as JUMP runs it


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


def _aps(
    meta: pd.DataFrame, x: Array, neg_sameby: list[str], neg_diffby: list[str]
) -> pd.DataFrame | None:
    """Per treated well AP, sorted by (perturbation, plate, well); None when none is defined."""
    from copairs.map import average_precision
    from copairs.matching import UnpairedException

    try:
        ap = average_precision(
            meta,
            x,
            pos_sameby=["perturbation"],
            pos_diffby=[],
            neg_sameby=neg_sameby,
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
        ap, sameby=["perturbation"], null_size=NULL_SIZE, threshold=0.05, seed=0, progress_bar=False
    )
    return float(maps["mean_average_precision"].mean()), float(maps["below_corrected_p"].mean())


def retrieval(profiles: Array, wells: Sequence[WellKey]) -> Retrieval:
    """Activity and distinctiveness APs and mAPs of well ``profiles`` (module docstring)."""
    meta = _meta(wells)
    # Activity ranks a well's replicates against the control wells of its own plate (JUMP:
    # copairs with neg_sameby Metadata_Plate): controls of other plates carry those plates'
    # nuisance, which pooled negatives would reward an encoder for seeing.
    aps: dict[str, pd.DataFrame | None] = {
        "activity": _aps(meta, profiles, ["plate"], ["is_control"])
    }
    treated = ~meta["is_control"].to_numpy()
    aps["distinctiveness"] = (
        _aps(meta[treated].reset_index(drop=True), profiles[treated], ["plate"], ["perturbation"])
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
