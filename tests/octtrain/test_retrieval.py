"""Retrieval mAP (copairs) and its two-stage bootstrap over perturbations and wells
(``eval/cellpainting/retrieval.py``), on profiles and APs whose right answer is known."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from octtrain.eval.cellpainting.profiles import WellKey
from octtrain.eval.cellpainting.retrieval import (
    map_interval,
    paired_difference,
    retrieval,
    retrieval_map,
)


def _wells(plates: int = 3) -> list[WellKey]:
    out = []
    for p in range(plates):
        for w, pert in enumerate(["DMSO", "DMSO", "a", "b"]):
            out.append(WellKey(f"P{p}", f"W{w}", pert, pert == "DMSO"))
    return out


def test_map_is_high_when_replicates_separate_and_chance_when_they_do_not() -> None:
    wells = _wells()
    rng = np.random.default_rng(0)
    centres = {"DMSO": np.zeros(8), "a": np.eye(8)[0] * 5, "b": np.eye(8)[1] * 5}
    good = np.stack([centres[w.perturbation] + rng.normal(0, 0.3, 8) for w in wells])
    noise = rng.normal(0, 1, (len(wells), 8))
    separated, mixed = retrieval_map(good, wells), retrieval_map(noise, wells)
    assert separated["activity_map"] > 0.95 and separated["distinctiveness_map"] > 0.95
    assert separated["activity_retrieved"] == 1.0
    assert mixed["activity_map"] < 0.8 and mixed["activity_retrieved"] < 1.0
    assert not any("consistency" in k for k in separated)  # JUMP's name: distinctiveness


def test_distinctiveness_ranks_against_other_perturbations_not_controls() -> None:
    wells = _wells()
    rng = np.random.default_rng(1)
    # a and b share one phenotype, away from the controls: active, not distinct.
    centres = {"DMSO": np.zeros(8), "a": np.eye(8)[0] * 5, "b": np.eye(8)[0] * 5}
    x = np.stack([centres[w.perturbation] + rng.normal(0, 0.3, 8) for w in wells])
    m = retrieval_map(x, wells)
    assert m["activity_map"] > 0.95 and m["distinctiveness_map"] < 0.8


def _aps(values: dict[str, list[float]]) -> pd.DataFrame:
    rows = [
        {"plate": "P1", "well": f"W{i:03d}", "perturbation": p, "average_precision": v}
        for p, vs in values.items()
        for i, v in enumerate(vs)
    ]
    return pd.DataFrame(rows).sort_values(["perturbation", "plate", "well"])


def test_the_interval_resamples_perturbations_so_more_wells_do_not_narrow_it() -> None:
    # Each perturbation's wells agree; perturbations differ: the uncertainty is which
    # perturbations were screened. Ten times the wells must not shrink the interval (a bootstrap
    # of AP rows would shrink it ~3x).
    levels = [0.2, 0.4, 0.6, 0.8, 1.0]
    few = map_interval(_aps({f"c{i}": [v] * 4 for i, v in enumerate(levels)}), 2000)
    many = map_interval(_aps({f"c{i}": [v] * 40 for i, v in enumerate(levels)}), 2000)
    assert few.value == pytest.approx(0.6) and many.value == pytest.approx(0.6)
    assert many.width > 0.8 * few.width > 0.2


def test_the_interval_resamples_wells_within_a_perturbation() -> None:
    # One perturbation: resampling perturbations alone would give a zero-width interval.
    ci = map_interval(_aps({"c0": [0.1, 0.5, 0.9, 0.3, 0.7, 1.0]}), 1000)
    assert ci.low < ci.value < ci.high and ci.width > 0.2


def test_the_interval_is_reproducible_and_nan_without_aps() -> None:
    aps = _aps({"c0": [0.1, 0.9], "c1": [0.5, 0.6]})
    assert map_interval(aps, 200, seed=3) == map_interval(aps, 200, seed=3)
    assert math.isnan(map_interval(None).value)


def test_a_paired_difference_of_an_encoder_with_itself_is_exactly_zero() -> None:
    aps = _aps({"c0": [0.1, 0.9, 0.4], "c1": [0.5, 0.6, 0.2]})
    d = paired_difference(aps, aps.copy(), 500)
    assert d.value == d.low == d.high == 0.0  # same draws for both


def test_a_paired_difference_is_narrower_than_the_unpaired_spread() -> None:
    rng = np.random.default_rng(2)
    base = {f"c{i}": list(rng.uniform(0.2, 1.0, 6)) for i in range(6)}
    better = {k: [min(1.0, v + 0.05) for v in vs] for k, vs in base.items()}
    a, b = _aps(better), _aps(base)
    d = paired_difference(a, b, 1000)
    assert d.low > 0.0  # a small, consistent gain is resolved...
    assert map_interval(a, 1000).low < map_interval(b, 1000).high  # ...that overlap would miss


def test_a_paired_difference_refuses_aps_of_different_wells() -> None:
    with pytest.raises(ValueError, match="same wells"):
        paired_difference(_aps({"c0": [0.1, 0.2]}), _aps({"c0": [0.1, 0.2, 0.3]}))


def test_retrieval_keeps_per_well_aps_of_treated_wells_only() -> None:
    wells = _wells()
    x = np.random.default_rng(3).normal(size=(len(wells), 6))
    r = retrieval(x, wells)
    ap = r.aps["activity"]
    assert ap is not None and set(ap["perturbation"]) == {"a", "b"} and len(ap) == 6
