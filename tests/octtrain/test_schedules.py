"""Schedules are pure: warmup then cosine, clamped past the end; EMA and weight decay ramps."""

from __future__ import annotations

import itertools

import pytest

from octtrain.config.pretrain import ScheduleConfig
from octtrain.errors import ConfigError
from octtrain.train.schedules import ema_momentum, warmup_cosine, weight_decay

LR = {"peak": 1e-3, "warmup_steps": 10, "total_steps": 100, "start": 0.0, "final": 1e-6}


def test_warmup_is_linear_from_start_to_peak() -> None:
    assert warmup_cosine(0, **LR) == pytest.approx(1e-4)
    assert warmup_cosine(4, **LR) == pytest.approx(5e-4)
    assert warmup_cosine(9, **LR) == pytest.approx(1e-3)
    assert warmup_cosine(10, **LR) == pytest.approx(1e-3)


def test_the_first_step_never_has_an_lr_of_exactly_zero() -> None:
    """XLA bakes 0 and 1 into a graph as constants: an lr of 0 at step 0 (and the weight-decay
    factor 1 - lr * wd = 1 it makes) would compile the step a second time at step 2."""
    first = warmup_cosine(0, **LR)
    assert first > 0 and 1 - first * 0.04 != 1


def test_cosine_never_rises_after_warmup_and_is_clamped_past_the_end() -> None:
    values = [warmup_cosine(s, **LR) for s in range(10, 300)]
    assert all(b <= a for a, b in itertools.pairwise(values))
    assert warmup_cosine(100, **LR) == pytest.approx(1e-6)
    assert warmup_cosine(250, **LR) == pytest.approx(1e-6)  # no restart past total_steps
    assert warmup_cosine(55, **LR) == pytest.approx((1e-3 + 1e-6) / 2)


def test_zero_warmup_starts_at_peak() -> None:
    assert warmup_cosine(0, **{**LR, "warmup_steps": 0}) == pytest.approx(1e-3)


def test_ema_momentum_ramps_linearly_and_stays_at_end() -> None:
    kw = {"total_steps": 100, "start": 0.996, "end": 1.0}
    assert ema_momentum(0, **kw) == pytest.approx(0.996)
    assert ema_momentum(50, **kw) == pytest.approx(0.998)
    assert ema_momentum(100, **kw) == ema_momentum(500, **kw) == pytest.approx(1.0)


def test_weight_decay_goes_from_start_to_end_by_cosine() -> None:
    kw = {"total_steps": 100, "start": 0.04, "end": 0.4}
    assert weight_decay(0, **kw) == pytest.approx(0.04)
    assert weight_decay(50, **kw) == pytest.approx(0.22)
    assert weight_decay(100, **kw) == weight_decay(1000, **kw) == pytest.approx(0.4)
    values = [weight_decay(s, **kw) for s in range(0, 150)]
    assert all(b >= a for a, b in itertools.pairwise(values))


def test_a_cosine_that_ends_before_its_warmup_is_refused_naming_both_keys() -> None:
    with pytest.raises(ConfigError, match=r"schedule\.total_steps \(5\).*schedule\.warmup_steps"):
        ScheduleConfig(warmup_steps=10, total_steps=5)
    with pytest.raises(ConfigError, match=r"schedule\.warmup_steps"):
        ScheduleConfig(warmup_steps=10, total_steps=10)
    ScheduleConfig(warmup_steps=10, total_steps=11)
    ScheduleConfig(
        warmup_steps=100, total_steps=None
    )  # the run's length: a short run may end in warmup


def test_past_a_warmup_longer_than_the_schedule_the_lr_is_final_never_peak() -> None:
    kw = {**LR, "warmup_steps": 10, "total_steps": 5}
    assert warmup_cosine(10, **kw) == pytest.approx(1e-6)
    assert warmup_cosine(50, **kw) == pytest.approx(1e-6)
