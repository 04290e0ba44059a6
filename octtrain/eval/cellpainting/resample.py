"""Bootstrap intervals of retrieval mAP that resample plates and control wells too (pure numpy).

A screen's evidence comes in plates, and within a plate in perturbations' wells and in the
negative-control wells every treated well is ranked against: the interval of an mAP should
move with each (the previous bootstrap resampled perturbations and their wells only, every
well's AP computed once on the controls as they are). Each draw resamples, in order:

1. the plates, with replacement (a plate drawn twice counts twice);
2. within each plate its control wells, with replacement: the activity APs are recomputed
   against the drawn controls (``activity_ap_draws``: a treated well's positives are the other
   wells of its perturbation on any plate, its negatives the control wells of its own plate,
   copairs' ``neg_sameby=["plate"]`` as JUMP runs it, by cosine similarity);
3. the perturbations, with replacement, then each drawn perturbation's wells on the drawn
   plates, with replacement.

Distinctiveness does not rank against controls, so its APs (copairs') are resampled in steps 1
and 3 only. Two encoders scored on the same wells share every draw (``Draws``), so the interval
of their difference accounts for what they share. Recomputing copairs itself in every draw
would cost a second per draw and encoder; the APs here equal copairs' with every control drawn
once (``tests/octtrain/test_resample.py``). A well's AP is never recomputed against its own
resampled copies: a well drawn twice would retrieve its copy at distance 0.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from octtrain.eval.cellpainting.profiles import Array, WellKey
from octtrain.eval.common.bootstrap import Interval

Index = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Draws:
    """``resamples`` draws over a set of wells: ``controls[r, c]``, how often control well ``c``
    (the wells' ``control_rows[c]``) is drawn; ``queries[r]``, per drawn perturbation the treated
    wells drawn (rows of the wells)."""

    control_rows: Index
    controls: npt.NDArray[np.float64]
    queries: list[list[Index]]

    @property
    def resamples(self) -> int:
        return len(self.queries)


def plan_draws(
    wells: Sequence[WellKey],
    resamples: int,
    seed: int = 0,
    perturbations: Collection[str] | None = None,
) -> Draws:
    """The draws of the module docstring over ``wells`` (the same for every encoder with the
    same arguments); ``perturbations``: draw only these (a subset's mAP), default every one."""
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    rng = np.random.default_rng([seed, 41])
    plates = sorted({w.plate for w in wells})
    plate_of = np.array([plates.index(w.plate) for w in wells])
    is_control = np.array([w.is_control for w in wells], dtype=bool)
    control_rows = np.flatnonzero(is_control).astype(np.int64)
    pert_of = np.array([w.perturbation for w in wells])
    perts = sorted({w.perturbation for w in wells if not w.is_control})
    if perturbations is not None:
        perts = [p for p in perts if p in set(perturbations)]
    if not perts:
        raise ValueError("no treated wells of the perturbations asked for to draw")
    # treated_of[p][k]: the rows of perturbation p's wells on plate k
    treated_of = [
        [np.flatnonzero((plate_of == k) & ~is_control & (pert_of == p)) for k in range(len(plates))]
        for p in perts
    ]
    controls = np.zeros((resamples, len(control_rows)))
    queries: list[list[Index]] = []
    for r in range(resamples):
        drawn_plates = rng.integers(0, len(plates), size=len(plates))
        for k in range(len(plates)):
            own = np.flatnonzero(plate_of[control_rows] == k)
            if len(own):
                np.add.at(controls[r], own[rng.integers(0, len(own), size=len(own))], 1.0)
        picked = []
        for p in rng.integers(0, len(perts), size=len(perts)):
            pool = np.concatenate([treated_of[p][k] for k in drawn_plates])
            if len(pool):
                picked.append(pool[rng.integers(0, len(pool), size=len(pool))].astype(np.int64))
        queries.append(picked)
    return Draws(control_rows, controls, queries)


def _cosine(x: Array) -> Array:
    unit = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    out: Array = unit @ unit.T
    return out


def activity_ap_draws(profiles: Array, wells: Sequence[WellKey], draws: Draws) -> Array:
    """``[resamples, wells]``: each treated well's activity AP against its plate's control
    wells as each draw weighs them (nan for a control well, or a well with no replicate)."""
    sim = _cosine(np.asarray(profiles, np.float64))
    n = len(wells)
    perts = np.array([w.perturbation for w in wells])
    plates = np.array([w.plate for w in wells])
    is_control = np.array([w.is_control for w in wells], dtype=bool)
    treated = np.flatnonzero(~is_control)
    positives = [np.flatnonzero((perts == perts[i]) & (np.arange(n) != i)) for i in treated]
    width = max((len(p) for p in positives), default=0)
    out = np.full((draws.resamples, n), math.nan)
    if width == 0 or not len(treated):
        return out
    pos_sim = np.full((len(treated), width), math.nan)
    for q, (i, pos) in enumerate(zip(treated, positives, strict=True)):
        pos_sim[q, : len(pos)] = sim[i, pos]
    valid = ~np.isnan(pos_sim)
    # Positives at or above each positive (itself included): its rank among the positives.
    filled = np.where(valid, pos_sim, -np.inf)
    pos_rank = (filled[:, None, :] >= filled[:, :, None]).sum(axis=2).astype(np.float64)
    # Controls of the query's own plate above each positive; the draws weigh each control.
    ctrl = draws.control_rows
    same_plate = plates[treated][:, None] == plates[ctrl][None, :]
    neg_sim = np.where(same_plate, sim[np.ix_(treated, ctrl)], -np.inf)
    above = (neg_sim[:, None, :] > filled[:, :, None]).astype(np.float64)
    neg_above = above.reshape(-1, len(ctrl)) @ draws.controls.T  # [queries * width, resamples]
    neg_above = neg_above.reshape(len(treated), width, -1).transpose(2, 0, 1)
    precision = pos_rank / (pos_rank + neg_above)
    with np.errstate(invalid="ignore"):
        ap = np.where(valid, precision, 0.0).sum(axis=2) / valid.sum(axis=1)
    out[:, treated] = np.where(valid.any(axis=1), ap, math.nan)
    return out


def fixed_ap_rows(ap: pd.DataFrame | None, wells: Sequence[WellKey], resamples: int) -> Array:
    """copairs' per-well APs (``plate``, ``well``, ``average_precision``) as ``[resamples,
    wells]`` rows that do not change with the draw (nan for a well without an AP)."""
    row = np.full(len(wells), math.nan)
    if ap is not None:
        at = {(w.plate, w.well): i for i, w in enumerate(wells)}
        cells = zip(ap["plate"], ap["well"], ap["average_precision"], strict=True)
        for plate, well, value in cells:
            row[at[(plate, well)]] = value
    return np.broadcast_to(row, (resamples, len(wells)))


def resampled_maps(ap_rows: Array, draws: Draws) -> Array:
    """Each draw's mAP: the mean over its drawn perturbations of their drawn wells' mean AP
    (a perturbation whose drawn wells have no AP is left out of that draw)."""
    out = np.full(draws.resamples, math.nan)
    for r, picked in enumerate(draws.queries):
        means = [np.nanmean(v) for v in (ap_rows[r, q] for q in picked) if np.isfinite(v).any()]
        if means:
            out[r] = float(np.mean(means))
    return out


def map_samples(
    kind: str, ap: pd.DataFrame | None, profiles: Array, wells: Sequence[WellKey], draws: Draws
) -> Array:
    """One encoder's mAP of ``kind`` in each draw: activity APs recomputed against the drawn
    controls, distinctiveness APs (copairs', ``ap``) as they are."""
    if ap is None:
        return np.full(draws.resamples, math.nan)
    if kind == "activity":
        rows = activity_ap_draws(profiles, wells, draws)
    else:
        rows = fixed_ap_rows(ap, wells, draws.resamples)
    return resampled_maps(rows, draws)


def subset_map(ap: pd.DataFrame | None, perturbations: Collection[str] | None = None) -> float:
    """The mAP of copairs' APs: the mean over perturbations (``perturbations`` only, when
    given) of their wells' mean AP; nan where none has an AP."""
    if ap is None:
        return math.nan
    if perturbations is not None:
        ap = ap[ap["perturbation"].isin(set(perturbations))]
    if ap.empty:
        return math.nan
    return float(ap.groupby("perturbation")["average_precision"].mean().mean())


def percentile_interval(value: float, samples: Array, confidence: float = 0.95) -> Interval:
    """``value`` with the percentile interval of ``samples`` (nan where there are none)."""
    finite = samples[np.isfinite(samples)]
    if finite.size == 0 or math.isnan(value):
        return Interval(value, math.nan, math.nan, len(samples), int(finite.size))
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(finite, [tail, 100.0 - tail])
    return Interval(value, float(low), float(high), len(samples), int(finite.size))
