"""Finetuning on real torch_xla: SPMD over two XLA:CPU devices, bf16 autocast, from a checkpoint
that XLA pretraining wrote (``octtrain finetune`` in its own process, see conftest.py)."""

from __future__ import annotations

import math
import sys

import pytest

from octtrain.runtime.checkpoint import load_checkpoint
from tests.xla.conftest import FINETUNE_EPOCHS, XlaRun

pytestmark = pytest.mark.xla

VAL_VOLUMES = 8  # the tiny cache's val split


def test_every_step_and_epoch_has_a_finite_loss(finetune_spmd: XlaRun) -> None:
    steps = finetune_spmd.series("train/loss")
    epochs = finetune_spmd.series("train_epoch/loss")
    assert sorted(epochs) == list(range(1, FINETUNE_EPOCHS + 1))
    assert len(steps) == FINETUNE_EPOCHS * 4  # 32 train volumes / batch 8
    assert all(math.isfinite(v) for v in [*steps.values(), *epochs.values()])
    assert len(set(steps.values())) > 1  # the weights move


def test_validation_counts_each_volume_once_every_epoch(finetune_spmd: XlaRun) -> None:
    # Sharded over the mesh, padded to static shapes, reduced once: still 8 samples, not 16.
    samples = finetune_spmd.series("val/samples")
    assert samples == {epoch: VAL_VOLUMES for epoch in range(1, FINETUNE_EPOCHS + 1)}
    for value in finetune_spmd.series("val/balanced_accuracy").values():
        assert 0.0 <= value <= 1.0
    assert all(math.isfinite(v) for v in finetune_spmd.series("val/loss").values())


def test_graph_compilations_stop_once_every_kind_of_epoch_ran(finetune_spmd: XlaRun) -> None:
    compiles = finetune_spmd.series("train_epoch/compile_count")
    # Epoch 1 (frozen encoder) compiles its graphs (4 measured); its validation and epoch 2
    # (unfrozen: new trainable parameters and optimizer groups) add theirs (5). From then on
    # every step, validation and checkpoint reuses them; epochs 3 and 4 are the check.
    assert compiles[1] < compiles[2], compiles
    assert compiles[3] == compiles[FINETUNE_EPOCHS], compiles
    assert finetune_spmd.result["compile_count"] == compiles[FINETUNE_EPOCHS], finetune_spmd.result


def test_best_checkpoint_loads_on_a_plain_cpu_torch(finetune_spmd: XlaRun) -> None:
    assert finetune_spmd.run_dir is not None
    assert "torch_xla" not in sys.modules
    state = load_checkpoint(str(finetune_spmd.run_dir / "checkpoints"))
    assert state["kind"] == "finetune"
    assert state["model"] and all(t.device.type == "cpu" for t in state["model"].values())
