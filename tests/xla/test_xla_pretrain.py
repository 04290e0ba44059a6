"""V-JEPA pretraining on real torch_xla: one XLA:CPU device, and SPMD data parallel over two.

Each run is ``octtrain pretrain`` (configs/pretrain/tiny.yaml, fp32, 12 steps, validation and
checkpoint at steps 6 and 12) in its own process; the assertions read its metrics.jsonl, its
checkpoints and torch_xla's counters.
"""

from __future__ import annotations

import math
import sys

import pytest
import torch

from octtrain.runtime.checkpoint import load_checkpoint
from tests.xla.conftest import PRETRAIN_STEPS, VAL_BATCH, VAL_EVERY, VAL_VOLUMES, XlaRun

pytestmark = pytest.mark.xla


@pytest.fixture(params=["one-device", "spmd-2"])
def run(request: pytest.FixtureRequest) -> XlaRun:
    name = "pretrain_one_device" if request.param == "one-device" else "pretrain_spmd"
    result: XlaRun = request.getfixturevalue(name)
    return result


def test_loss_is_finite_every_step_and_goes_down(run: XlaRun) -> None:
    loss = run.series("train/loss")
    assert sorted(loss) == list(range(1, PRETRAIN_STEPS + 1))
    assert all(math.isfinite(v) for v in loss.values())
    first, last = [loss[s] for s in (1, 2, 3)], [loss[s] for s in (10, 11, 12)]
    assert sum(last) / 3 < sum(first) / 3 - 0.02, loss
    val = run.series("val/loss")
    assert sorted(val) == [VAL_EVERY, PRETRAIN_STEPS]
    assert all(math.isfinite(v) for v in val.values())


def test_graph_compilations_stop_after_the_first_steps(run: XlaRun) -> None:
    compiles = run.series("train/compile_count")
    # Setup, first step (optimizer state appears) and the steady step: then no more until the
    # first validation adds its graph; after it, nothing new up to the end of the process
    # (steps 7-12, the second validation, the checkpoints).
    assert compiles[3] == compiles[VAL_EVERY], compiles
    assert compiles[VAL_EVERY + 1] == compiles[PRETRAIN_STEPS], compiles
    assert run.result["compile_count"] == compiles[PRETRAIN_STEPS], (run.result, compiles)
    # Every later step found its graph in the cache instead of compiling one.
    assert run.result["compile_count"] <= 6, run.result
    assert run.result["cache_hits"] >= PRETRAIN_STEPS - 2, run.result
    # One execution per step (plus setup and one per validation batch): a host read inside the
    # step (``.item()``, a NaN check, a feature selection outside it) would add one per step.
    val_batches = 2 * -(-VAL_VOLUMES // VAL_BATCH)  # two validations
    assert run.result["execute_count"] <= PRETRAIN_STEPS + val_batches + 3, run.result


def test_train_metrics_precede_validation_grad_norm_is_measured_fillers_are_dropped(
    run: XlaRun,
) -> None:
    order = [
        ("train" if "train/loss" in r else "val", r["step"])
        for r in run.records
        if "train/loss" in r or "val/loss" in r
    ]
    at = order.index(("val", VAL_EVERY))
    assert order[at - 1] == ("train", VAL_EVERY)  # the step's train record is out first
    norms = run.series("train/grad_norm")
    assert sorted(norms) == list(range(1, PRETRAIN_STEPS + 1))
    assert all(math.isfinite(v) and v > 0 for v in norms.values())  # before zeroing
    # 8 volumes in padded batches of 6 over the mesh: fillers never counted.
    assert run.series("val/samples") == {VAL_EVERY: VAL_VOLUMES, PRETRAIN_STEPS: VAL_VOLUMES}
    erank = run.series("train/feat_erank")
    assert erank and all(v > 1.0 for v in erank.values())


def test_checkpoint_written_on_xla_loads_on_a_plain_cpu_torch(run: XlaRun) -> None:
    assert run.run_dir is not None
    assert "torch_xla" not in sys.modules  # this process has never started XLA
    state = load_checkpoint(str(run.run_dir / "checkpoints"))
    assert state["step"] == PRETRAIN_STEPS
    tensors = [
        v for part in ("encoder", "predictor", "target_encoder") for v in state[part].values()
    ]
    assert tensors and all(t.device.type == "cpu" for t in tensors)
    assert all(torch.isfinite(t).all() for t in tensors if t.is_floating_point())


def test_spmd_over_two_devices_trains_like_one_device(
    pretrain_one_device: XlaRun, pretrain_spmd: XlaRun
) -> None:
    # The same global batch of 8, now split 4 + 4 over the mesh: same losses up to the order of
    # floating-point reductions.
    one = pretrain_one_device.series("train/loss")
    two = pretrain_spmd.series("train/loss")
    assert one.keys() == two.keys()
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=2e-3, abs=1e-4), step
