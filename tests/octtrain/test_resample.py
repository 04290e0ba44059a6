"""The bootstrap that resamples plates and control wells (``eval/cellpainting/resample.py``):
its APs are copairs' on the controls as drawn, and its draws move with plates and controls."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from octtrain.eval.cellpainting.profiles import WellKey
from octtrain.eval.cellpainting.resample import (
    Draws,
    activity_ap_draws,
    fixed_ap_rows,
    percentile_interval,
    plan_draws,
    resampled_maps,
    subset_map,
)
from octtrain.eval.cellpainting.retrieval import Retrieval, retrieval
from octtrain.eval.cellpainting.scores import Scored, paired_difference, profile_scores
from octtrain.eval.common.bootstrap import Interval
from tests.octtrain.cell_cache import WellField


def _screen(seed: int = 0, plates: int = 3) -> tuple[np.ndarray, list[WellKey]]:
    rng = np.random.default_rng(seed)
    wells, rows = [], []
    for p in range(plates):
        for w, pert in enumerate(["DMSO"] * 4 + ["a", "a", "b", "b", "c"]):
            wells.append(WellKey(f"P{p}", f"W{w:02d}", pert, pert == "DMSO"))
            centre = {"DMSO": 0.0, "a": 1.0, "b": -0.7, "c": 0.3}[pert]
            rows.append(centre * np.eye(6)[p % 2] + rng.normal(0, 0.6, 6) + p * 0.2)
    return np.stack(rows), wells


def test_activity_aps_equal_copairs_same_plate_negatives_when_every_control_is_drawn_once() -> None:
    x, wells = _screen()
    ones = Draws(
        np.flatnonzero([w.is_control for w in wells]).astype(np.int64),
        np.ones((1, sum(w.is_control for w in wells))),
        [[]],
    )
    ours = activity_ap_draws(x, wells, ones)[0]
    ap = retrieval(x, wells).aps["activity"]
    assert ap is not None
    at = {(w.plate, w.well): i for i, w in enumerate(wells)}
    theirs = np.array([ours[at[(p, w)]] for p, w in zip(ap["plate"], ap["well"], strict=True)])
    np.testing.assert_allclose(theirs, ap["average_precision"].to_numpy(), atol=1e-9)
    assert np.isnan(ours[[i for i, w in enumerate(wells) if w.is_control]]).all()


def test_a_control_drawn_twice_weighs_twice_and_only_on_its_own_plate() -> None:
    x, wells = _screen(1)
    ctrl = np.flatnonzero([w.is_control for w in wells]).astype(np.int64)
    base = np.ones((1, len(ctrl)))
    heavy = base.copy()
    heavy[0, 0] = 5.0  # the first control of plate P0, five times
    a = activity_ap_draws(x, wells, Draws(ctrl, np.vstack([base, heavy]), [[], []]))
    moved = ~np.isclose(a[0], a[1]) & ~np.isnan(a[0])
    assert moved.any()
    assert {wells[i].plate for i in np.flatnonzero(moved)} == {"P0"}


def test_draws_resample_plates_controls_and_wells_and_are_seeded() -> None:
    _, wells = _screen(plates=4)
    d1, d2 = plan_draws(wells, 200, seed=3), plan_draws(wells, 200, seed=3)
    np.testing.assert_array_equal(d1.controls, d2.controls)
    assert d1.controls.sum(axis=1).tolist() == [16.0] * 200  # 4 per plate, 4 plates
    assert (d1.controls.std(axis=0) > 0).all()  # every control's weight varies
    plates_seen = [{wells[i].plate for q in d1.queries[r] for i in q} for r in range(200)]
    assert any(len(s) < 4 for s in plates_seen)  # a draw that left a plate out
    with pytest.raises(ValueError, match="resamples"):
        plan_draws(wells, 0)


def test_resampled_maps_average_perturbations_then_wells_and_the_fixed_aps_broadcast() -> None:
    _, wells = _screen()
    x, _ = _screen()
    ap = retrieval(x, wells).aps["distinctiveness"]
    rows = fixed_ap_rows(ap, wells, 3)
    assert rows.shape == (3, len(wells))
    a_rows = [i for i, w in enumerate(wells) if w.perturbation == "a"]
    c_rows = [i for i, w in enumerate(wells) if w.perturbation == "c"]
    d = Draws(np.zeros(0, np.int64), np.zeros((1, 0)), [[np.array(a_rows), np.array(c_rows)]])
    expect = np.mean([np.nanmean(rows[0, a_rows]), np.nanmean(rows[0, c_rows])])
    assert resampled_maps(rows[:1], d)[0] == pytest.approx(expect)


def _fixed(values: dict[str, list[float]], resamples: int, seed: int = 0) -> Scored:
    """An encoder whose per-well APs are ``values`` (one plate, no controls), bootstrapped."""
    wells = [
        WellKey("P1", f"{p}{i:03d}", p, False) for p, vs in values.items() for i in range(len(vs))
    ]
    ap = pd.DataFrame(
        {
            "plate": [w.plate for w in wells],
            "well": [w.well for w in wells],
            "perturbation": [w.perturbation for w in wells],
            "average_precision": [v for vs in values.values() for v in vs],
        }
    )
    draws = plan_draws(wells, resamples, seed)
    samples = resampled_maps(fixed_ap_rows(ap, wells, resamples), draws)
    return Scored({}, Retrieval({}, {}), [], {"activity": (subset_map(ap), samples)})


def _ci(s: Scored) -> Interval:
    return percentile_interval(*s.samples["activity"])


def test_the_interval_resamples_perturbations_so_more_wells_do_not_narrow_it() -> None:
    # Each perturbation's wells agree; perturbations differ: the uncertainty is which
    # perturbations were screened. Ten times the wells must not shrink the interval (a bootstrap
    # of AP rows would shrink it ~3x).
    levels = [0.2, 0.4, 0.6, 0.8, 1.0]
    few = _ci(_fixed({f"c{i}": [v] * 4 for i, v in enumerate(levels)}, 2000))
    many = _ci(_fixed({f"c{i}": [v] * 40 for i, v in enumerate(levels)}, 2000))
    assert few.value == pytest.approx(0.6) and many.value == pytest.approx(0.6)
    assert many.width > 0.8 * few.width > 0.2


def test_the_interval_resamples_wells_within_a_perturbation() -> None:
    # One perturbation: resampling perturbations alone would give a zero-width interval.
    ci = _ci(_fixed({"c0": [0.1, 0.5, 0.9, 0.3, 0.7, 1.0]}, 1000))
    assert ci.low < ci.value < ci.high and ci.width > 0.2


def test_the_interval_is_reproducible_and_nan_without_aps() -> None:
    values = {"c0": [0.1, 0.9], "c1": [0.5, 0.6]}
    assert _ci(_fixed(values, 200, seed=3)) == _ci(_fixed(values, 200, seed=3))
    assert np.isnan(subset_map(None))


def test_a_paired_difference_of_an_encoder_with_itself_is_exactly_zero() -> None:
    a = _fixed({"c0": [0.1, 0.9, 0.4], "c1": [0.5, 0.6, 0.2]}, 500)
    d = paired_difference(a, a, "activity")
    assert d.value == d.low == d.high == 0.0  # same draws for both


def test_a_paired_difference_is_narrower_than_the_unpaired_spread() -> None:
    rng = np.random.default_rng(2)
    base = {f"c{i}": list(rng.uniform(0.2, 1.0, 6)) for i in range(6)}
    better = {k: [min(1.0, v + 0.05) for v in vs] for k, vs in base.items()}
    a, b = _fixed(better, 1000), _fixed(base, 1000)
    d = paired_difference(a, b, "activity")
    assert d.low > 0.0  # a small, consistent gain is resolved...
    assert _ci(a).low < _ci(b).high  # ...that overlap would miss


def test_a_paired_difference_refuses_scores_of_other_draws() -> None:
    with pytest.raises(ValueError, match="same wells"):
        paired_difference(
            _fixed({"c0": [0.1, 0.2]}, 10), _fixed({"c0": [0.1, 0.2]}, 20), "activity"
        )


def test_held_out_compounds_are_scored_apart() -> None:
    x, wells = _screen(2, plates=4)
    fields = [WellField(w.plate, w.well, w.perturbation, w.is_control) for w in wells]
    a = profile_scores(x, fields, resamples=100, unseen=["c", "not screened"])  # type: ignore[arg-type]
    b = profile_scores(x + 0.5, fields, resamples=100, unseen=["c"])  # type: ignore[arg-type]
    ap = a.retrieval.aps["activity"]
    assert ap is not None
    only_c = ap[ap["perturbation"] == "c"]["average_precision"].mean()
    assert a.metrics["unseen_activity_map"] == pytest.approx(only_c)
    assert a.metrics["unseen_activity_map_low"] <= only_c <= a.metrics["unseen_activity_map_high"]
    assert a.metrics["activity_map"] != pytest.approx(only_c)
    d = paired_difference(a, b, "unseen_activity")
    assert d.low <= d.value <= d.high and d.resamples == 100
    none = profile_scores(x, fields, resamples=20)  # type: ignore[arg-type]
    assert "unseen_activity_map" not in none.metrics


def test_a_draw_that_leaves_a_plate_out_scores_the_other_plate_alone() -> None:
    # Every well of P0 retrieves perfectly, every well of P1 not at all: a draw of the plates
    # {P0, P0} scores 1, {P1, P1} 0 (half the draws); without plate draws every draw mixes both.
    wells = [
        WellKey(f"P{p}", f"W{p}{i:02d}", pert, False)
        for p in range(2)
        for pert in ("a", "b", "c")
        for i in range(8)
    ]
    rows = np.array([[1.0 if w.plate == "P0" else 0.0 for w in wells]])
    maps = resampled_maps(np.repeat(rows, 400, axis=0), plan_draws(wells, 400, seed=5))
    assert 0.3 < np.mean((maps == 0.0) | (maps == 1.0)) < 0.7


def test_draws_refuse_a_subset_without_treated_wells_and_keep_each_plates_control_count() -> None:
    _, wells = _screen(0, plates=3)
    with pytest.raises(ValueError, match="no treated wells"):
        plan_draws(wells, 10, perturbations=["not screened"])
    draws = plan_draws(wells, 30)
    plate_of = np.array([wells[i].plate for i in draws.control_rows])
    for plate in sorted(set(plate_of)):
        own = plate_of == plate
        # each plate's controls drawn from its own: as many draws as it has control wells
        assert (draws.controls[:, own].sum(axis=1) == own.sum()).all(), plate


def test_a_perturbation_without_an_ap_in_a_draw_is_left_out_not_counted_as_zero() -> None:
    ap_rows = np.array([[0.8, 0.6, np.nan, np.nan]])
    draws = Draws(np.array([], np.int64), np.zeros((1, 0)), [[np.array([0, 1]), np.array([2, 3])]])
    assert resampled_maps(ap_rows, draws)[0] == pytest.approx(0.7)


def test_a_nan_map_has_no_interval() -> None:
    interval = percentile_interval(math.nan, np.array([0.4, 0.5, 0.6]))
    assert math.isnan(interval.low) and math.isnan(interval.high)
