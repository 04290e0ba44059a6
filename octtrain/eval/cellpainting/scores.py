"""An encoder's scores from its field embeddings, under each of JUMP's two recipes (pure).

Field embeddings become well profiles (the mean of a well's fields) and go through one of the
recipes of ``recipe.py``:

* ``dl``, JUMP's compound recipe, for CellProfiler and deep-learning features alike
  (jump-profiling-recipe's ``compound`` and ``compound_DL`` configurations: the variance
  filter, per-plate robust z-score to the control wells, rank inverse normal transform,
  feature selection; Harmony across sources, which the one-source twin does not need; no
  sphering). The primary recipe: it is what JUMP runs on compound plates.
* ``sphered``: the same, then ZCA sphering fitted on the control wells (JUMP's ORF and CRISPR
  pipelines). Sphering alone moves an encoder's ranking, and raises the chance floor (the
  controls it is fitted on are the negatives it ranks), so both are reported.

Then copairs' activity and distinctiveness mAP (``retrieval.py``) with intervals that resample
plates, control wells, perturbations and wells (``resample.py``), over every perturbation and
over subsets (``subsets``): where some perturbations were kept out of training (``unseen``),
those alone, and for a twin with phenotype families (``families``: ``named``, ``library``,
``learned``), each family alone. Keys ``<kind>_map`` / ``_low`` / ``_high``, then
``unseen_<kind>_map`` / ..., ``learned_<kind>_map`` / ... The k-NN probes of the perturbation
classes on well profiles and on field embeddings come beside them.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from octtrain.data.cellpainting import FieldRecord
from octtrain.eval.cellpainting.profiles import Array, WellKey, recipe_profiles
from octtrain.eval.cellpainting.recipe import RecipeConfig
from octtrain.eval.cellpainting.resample import (
    map_samples,
    percentile_interval,
    plan_draws,
    subset_map,
)
from octtrain.eval.cellpainting.retrieval import KINDS, Retrieval
from octtrain.eval.cellpainting.retrieval import retrieval as score_retrieval
from octtrain.eval.common.bootstrap import Interval
from octtrain.eval.common.knn import knn_balanced_accuracy

RESAMPLES = 1000
RECIPES = {"dl": RecipeConfig(sphere=False), "sphered": RecipeConfig(sphere=True)}
PRIMARY = "dl"


class ProfiledField(FieldRecord, Protocol):
    """A manifest field with the Cell Painting typed part the profiles group by."""

    @property
    def plate(self) -> str: ...
    @property
    def well(self) -> str: ...
    @property
    def perturbation(self) -> str: ...
    @property
    def is_control(self) -> bool: ...


@dataclass(frozen=True)
class Scored:
    """One encoder's metrics (floats: mAPs, their intervals, probes), per-well APs, the recipe's
    notes, and per subset and kind its mAP's value and bootstrap samples (for paired
    differences: encoders scored on the same wells share every draw)."""

    metrics: dict[str, float]
    retrieval: Retrieval
    notes: list[str]
    samples: dict[str, tuple[float, Array]] = field(default_factory=dict)


def well_keys(fields: Sequence[ProfiledField]) -> list[WellKey]:
    return [WellKey(f.plate, f.well, f.perturbation, f.is_control) for f in fields]


def subsets(
    present: Collection[str],
    unseen: Collection[str] = (),
    families: Mapping[str, Collection[str]] | None = None,
) -> dict[str, list[str] | None]:
    """key prefix -> the perturbations it scores (``None``: every one): ``""``, then
    ``unseen_`` and ``<family>_`` for each that holds any of the ``present`` perturbations."""
    out: dict[str, list[str] | None] = {"": None}
    for prefix, ids in [("unseen_", unseen), *((f"{n}_", i) for n, i in (families or {}).items())]:
        only = sorted(set(ids) & set(present))
        if only:
            out[prefix] = only
    return out


def profile_scores(
    x: Array,
    fields: Sequence[ProfiledField],
    resamples: int = RESAMPLES,
    recipe: RecipeConfig | None = None,
    unseen: Collection[str] = (),
    families: Mapping[str, Collection[str]] | None = None,
) -> Scored:
    """One encoder's scores from its field embeddings ``x`` (a row per field of ``fields``)
    under ``recipe`` (default: the primary one); ``unseen``: perturbations kept out of
    training, and ``families``: family -> its perturbations, each scored apart as well (module
    docstring)."""
    keys = well_keys(fields)
    classes = sorted({k.perturbation for k in keys})
    field_labels = np.array([classes.index(k.perturbation) for k in keys])
    result, wells = recipe_profiles(x, keys, recipe or RECIPES[PRIMARY])
    well_labels = np.array([classes.index(w.perturbation) for w in wells])
    scored = score_retrieval(result.profiles, wells)
    metrics = dict(scored.maps)
    samples: dict[str, tuple[float, Array]] = {}
    treated = {w.perturbation for w in wells if not w.is_control}
    for prefix, only in subsets(treated, unseen, families).items():
        draws = plan_draws(wells, resamples, perturbations=only)
        for kind in KINDS:
            ap = scored.aps[kind]
            value = subset_map(ap, only)
            draw_maps = map_samples(kind, ap, result.profiles, wells, draws)
            ci = percentile_interval(value, draw_maps)
            samples[prefix + kind] = (value, draw_maps)
            name = f"{prefix}{kind}_map"
            metrics[name], metrics[f"{name}_low"], metrics[f"{name}_high"] = value, ci.low, ci.high
    metrics["well_probe_knn_balanced_accuracy"] = knn_balanced_accuracy(
        result.profiles, well_labels
    )
    metrics["field_probe_knn_balanced_accuracy"] = knn_balanced_accuracy(x, field_labels)
    metrics["wells"] = float(len(wells))
    metrics["features_kept"] = float(len(result.kept))
    metrics["sphered"] = float(result.sphered)
    return Scored(metrics, scored, result.notes, samples)


def profile_metrics(x: Array, fields: Sequence[ProfiledField]) -> dict[str, float]:
    """``profile_scores``' metrics under the primary recipe (what DINO's validation logs)."""
    return profile_scores(x, fields).metrics


def paired_difference(a: Scored, b: Scored, key: str) -> Interval:
    """mAP(a) - mAP(b) of ``key`` (a kind, with its subset prefix) with its interval from the
    same draws for both: two encoders' scores on the same fields."""
    if key not in a.samples or key not in b.samples:
        return Interval(math.nan, math.nan, math.nan, 0, 0)
    (va, sa), (vb, sb) = a.samples[key], b.samples[key]
    if sa.shape != sb.shape:
        raise ValueError("a paired difference needs the scores of the same wells and draws")
    return percentile_interval(va - vb, sa - sb)


def per_perturbation(scored: Scored) -> dict[str, dict[str, float]]:
    """kind -> perturbation -> its mean AP (which phenotypes an encoder sees)."""
    out: dict[str, dict[str, float]] = {}
    for kind, ap in scored.retrieval.aps.items():
        if ap is not None:
            means = ap.groupby("perturbation")["average_precision"].mean()
            out[kind] = {str(k): float(v) for k, v in means.items()}
    return out
