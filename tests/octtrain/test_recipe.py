"""JUMP's profiling recipe for learned features (``eval/cellpainting/recipe.py``), step by step, on
arrays whose
right answer is known: no I/O."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

from octtrain.eval.cellpainting.recipe import (
    MAD_SCALE,
    RecipeConfig,
    apply_recipe,
    can_sphere,
    correlated,
    near_constant,
    rank_inverse_normal,
    robust_z,
    robust_z_by_plate,
    select_features,
    sphere,
    variant,
)


def test_robust_z_uses_the_controls_median_and_scaled_mad_not_all_wells() -> None:
    x = np.array([[1.0], [2.0], [3.0], [100.0], [50.0]])
    controls = np.array([True, True, True, False, False])
    z = robust_z(x, controls, epsilon=1e-9)
    # controls: median 2, MAD 1 -> scale 1.4826; a treated outlier does not move either.
    assert z[:, 0] == pytest.approx((x[:, 0] - 2.0) / MAD_SCALE)


def test_robust_z_is_finite_when_the_controls_do_not_vary() -> None:
    x = np.array([[5.0], [5.0], [7.0]])
    z = robust_z(x, np.array([True, True, False]), epsilon=1e-6)
    assert np.all(np.isfinite(z)) and z[2, 0] == pytest.approx(2.0 / 1e-6)


def test_each_plate_is_scaled_against_its_own_controls() -> None:
    rng = np.random.default_rng(0)
    base = rng.normal(size=(8, 3))
    x = np.vstack([base, base * 3.0 + 100.0])  # plate P2: the same wells, gain and offset
    plates = ["P1"] * 8 + ["P2"] * 8
    controls = np.array([True, True, True, False, False, False, True, False] * 2)
    z, notes = robust_z_by_plate(x, plates, controls)
    np.testing.assert_allclose(z[:8], z[8:], rtol=1e-4, atol=1e-4)  # plate effect gone
    assert notes == []


def test_a_plate_without_enough_controls_is_scaled_against_all_its_wells_and_said() -> None:
    x = np.arange(8, dtype=np.float64).reshape(4, 2)
    z, notes = robust_z_by_plate(x, ["P1"] * 4, np.array([True, False, False, False]))
    assert notes == ["plate P1: 1 control well(s), scaled against all its wells"]
    assert np.all(np.isfinite(z)) and abs(float(np.median(z[:, 0]))) < 1e-9


def test_rank_inverse_normal_gives_blom_quantiles_whatever_the_tails() -> None:
    x = np.array([[1.0], [2.0], [3.0], [1e9]])  # one extreme well
    out = rank_inverse_normal(x)
    expected = norm.ppf((np.arange(1, 5) - 0.375) / (4 + 0.25))
    np.testing.assert_allclose(out[:, 0], expected, rtol=1e-9)
    ties = rank_inverse_normal(np.array([[1.0], [1.0], [2.0]]))
    assert ties[0, 0] == ties[1, 0] < ties[2, 0]


def test_near_constant_features_are_dropped_as_pycytominer_does() -> None:
    n = 100
    varied = np.linspace(0, 1, n)
    constant = np.zeros(n)
    rare = np.zeros(n)
    rare[0] = 1.0  # second value 1/99 as common as the first: below freq_cut 0.05
    drop = near_constant(np.stack([varied, constant, rare], axis=1), 0.05, 0.01)
    assert drop.tolist() == [False, True, True]


def test_of_a_correlated_pair_the_feature_more_correlated_with_all_goes() -> None:
    rng = np.random.default_rng(1)
    a = rng.normal(size=200)
    b = a + rng.normal(scale=0.05, size=200)  # r ~ 0.999 with a
    c = rng.normal(size=200)
    d = 0.5 * a + 0.5 * c + rng.normal(scale=0.3, size=200)  # below 0.9 with all: stays
    x = np.stack([a, b, c, d], axis=1)
    drop = correlated(x, 0.9)
    assert drop.sum() == 1 and (drop[0] or drop[1])  # one of the pair, nothing else
    r = np.abs(np.corrcoef(x, rowvar=False))
    np.fill_diagonal(r, 0.0)
    gone = 0 if drop[0] else 1
    assert r[gone].mean() >= r[1 - gone].mean()


def test_select_features_keeps_one_of_each_correlated_group_and_no_constant() -> None:
    rng = np.random.default_rng(2)
    a, c = rng.normal(size=50), rng.normal(size=50)
    x = np.stack([a, 2 * a + 1, np.ones(50), c], axis=1)
    kept = select_features(x, RecipeConfig())
    assert len(kept) == 2 and 3 in kept and 2 not in kept


def test_sphering_whitens_the_controls() -> None:
    rng = np.random.default_rng(3)
    mix = np.array([[2.0, 0.0, 0.0], [1.5, 0.5, 0.0], [0.0, 0.3, 1.0]])
    x = rng.normal(size=(300, 3)) @ mix
    controls = np.zeros(300, dtype=bool)
    controls[:200] = True
    white = sphere(x, controls, 1e-9)
    np.testing.assert_allclose(np.cov(white[controls], rowvar=False), np.eye(3), atol=1e-6)


def test_sphering_needs_more_control_wells_than_features() -> None:
    assert can_sphere(40, 10) and not can_sphere(10, 10) and not can_sphere(5, 0)


def test_with_fewer_controls_than_features_the_recipe_spheres_a_shrunk_covariance() -> None:
    # Every encoder is sphered, whatever its feature count: skipping the step for the encoders
    # with more features than control wells would score them under another recipe.
    rng = np.random.default_rng(4)
    x = rng.normal(size=(24, 30)) @ rng.normal(size=(30, 30))  # correlated features
    plates = ["P1"] * 12 + ["P2"] * 12
    controls = np.array(([True] * 4 + [False] * 8) * 2)
    result = apply_recipe(x, plates, controls)
    assert result.sphered
    assert any("Ledoit-Wolf covariance: 8 control wells for" in n for n in result.notes)
    assert result.profiles.shape == (24, len(result.kept))
    # A plain whitening of 8 wells' covariance blows the 20+ null directions up by 1/sqrt(eps);
    # the shrunk one stays on the scale of the data.
    assert np.abs(result.profiles).max() < 100.0
    plain = sphere(x[:, result.kept], controls, 1e-6)
    assert np.abs(plain).max() > 100.0


def test_with_many_controls_the_shrunk_sphering_is_the_plain_one() -> None:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(2000, 3)) @ np.array([[2.0, 0.0, 0.0], [1.5, 0.5, 0.0], [0.0, 0.3, 1.0]])
    controls = np.zeros(2000, dtype=bool)
    controls[::2] = True
    shrunk, plain = sphere(x, controls, 1e-9, True), sphere(x, controls, 1e-9)
    np.testing.assert_allclose(np.cov(shrunk[controls], rowvar=False), np.eye(3), atol=0.1)
    assert np.abs(shrunk - plain).max() < 0.1 * np.abs(plain).max()


def test_the_recipe_skips_sphering_without_two_control_wells_and_says_so() -> None:
    x = np.random.default_rng(6).normal(size=(12, 3))
    controls = np.array([True] + [False] * 11)
    result = apply_recipe(x, ["P1"] * 12, controls)
    assert not result.sphered
    assert any("sphering skipped: 1 control wells" in n for n in result.notes)


def test_the_recipe_spheres_when_controls_allow() -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(60, 3))
    controls = np.array([True, False] * 30)
    result = apply_recipe(x, ["P1"] * 60, controls)
    assert result.sphered and result.notes == [] and result.profiles.shape == (60, 3)


def test_the_recipe_refuses_mismatched_inputs_and_bad_thresholds() -> None:
    with pytest.raises(ValueError, match="3 wells, 2 plates"):
        apply_recipe(np.zeros((3, 2)), ["P1", "P1"], np.array([True, False, False]))
    with pytest.raises(ValueError, match="corr_threshold"):
        RecipeConfig(corr_threshold=0.0)
    with pytest.raises(ValueError, match="epsilon"):
        RecipeConfig(epsilon=0.0)


def test_a_feature_whose_correlated_partner_is_already_gone_stays() -> None:
    # A chain a - b - c (|r| 0.94 each link, a - c 0.89): dropping b breaks both links, so c
    # stays. Without the "already dropped" check the second link would drop c as well.
    rng = np.random.default_rng(52)
    a = rng.normal(size=300)
    b = a + 0.35 * rng.normal(size=300)
    c = b + 0.35 * rng.normal(size=300)
    e = rng.normal(size=300)
    x = np.stack([a, b, c, 0.8 * c + 0.6 * e, e], axis=1)
    assert correlated(x, 0.9).tolist() == [False, True, False, False, False]


def test_each_step_of_the_recipe_is_pinned_on_a_small_plate() -> None:
    # Two plates of 3 controls and 3 treated wells, 3 features: the unsphered recipe's output is
    # the per-plate robust z, then Blom's rank transform over all wells, then the kept features.
    rng = np.random.default_rng(7)
    x = rng.normal(size=(12, 3)) * [1.0, 2.0, 0.5] + [0.0, 5.0, -1.0]
    x[6:] *= 3.0  # plate P2's gain: the robust z must remove it
    plates = ["P1"] * 6 + ["P2"] * 6
    controls = np.array([True, True, True, False, False, False] * 2)
    cfg = RecipeConfig(sphere=False, corr_threshold=1.0)
    z = np.vstack([robust_z(x[:6], controls[:6]), robust_z(x[6:], controls[6:])])
    expect = rank_inverse_normal(z)
    result = apply_recipe(x, plates, controls, cfg)
    np.testing.assert_allclose(result.profiles, expect[:, result.kept], atol=1e-12)
    assert list(result.kept) == [0, 1, 2] and not result.sphered


def test_jumps_var_step_drops_a_feature_without_spread_on_any_plates_controls() -> None:
    rng = np.random.default_rng(0)
    plates = ["P0"] * 8 + ["P1"] * 8
    controls = np.array(([True] * 4 + [False] * 4) * 2)
    x = rng.normal(5.0, 1.0, (16, 5))
    x[8:12, 0] = 3.0  # constant over P1's controls (it varies elsewhere): MAD 0 there
    x[13, 1] = np.nan  # not finite in one well
    x[0:4, 2] = [-1.0, 0.0, 0.0, 1.0]  # P0's controls' median 0: JUMP's coefficient 0
    # controls' MAD 0.25 at a median of 1000: 2.5e-4, below JUMP's 1e-3
    x[:, 3] = 1000.0 + np.tile([-0.5, 0.0, 0.0, 0.5], 4)
    assert variant(x, plates, controls).tolist() == [False, False, False, False, True]
    result = apply_recipe(x, plates, controls, RecipeConfig(sphere=False))
    assert result.kept.tolist() == [4]  # the input's column, not the filtered one's
    assert any(note.startswith("var: 4 of 5 features dropped") for note in result.notes)
    # every feature varies: nothing dropped, no note
    assert variant(rng.normal(5.0, 1.0, (16, 3)), plates, controls).all()


def test_the_correlation_filter_keeps_everything_below_three_wells() -> None:
    # two wells make every pair of features correlated +-1: nothing can be judged, nothing drops
    x = np.array([[0.0, 1.0, 5.0], [1.0, 3.0, 2.0]])
    assert not correlated(x, 0.9).any()
