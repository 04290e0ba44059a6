"""Attention and checkpointing on XLA:CPU: the scan-based blocked kernel and torch_xla's checkpoint
give the eager reference's results (computed in attention_probe.py, its own process)."""

from __future__ import annotations

import pytest

from tests.xla.conftest import XlaRun, run_xla

pytestmark = pytest.mark.xla


@pytest.fixture(scope="module")
def probe() -> XlaRun:
    return run_xla("attention_probe", [], devices=1, run_dir=None)


def test_auto_is_blocked_on_xla_cpu(probe: XlaRun) -> None:
    assert probe.result["auto"] == "blocked"


def test_blocked_matches_math_forward_and_backward_on_xla(probe: XlaRun) -> None:
    assert probe.result["blocked_vs_math"] < 1e-5


def test_checkpointing_keeps_loss_and_gradients_on_xla(probe: XlaRun) -> None:
    found = probe.result["checkpointing"]
    assert found["grad_count"] > 0
    assert found["loss"] < 1e-6 and found["grads"] < 1e-5
