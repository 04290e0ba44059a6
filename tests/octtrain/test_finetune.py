"""Finetuning: real tiny runs (pretrain -> finetune) on CPU; its pieces are in
``test_finetune_parts.py``."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from octstage import manifest as mf
from octtrain.errors import CheckpointError, ConfigError
from octtrain.eval.common.validation import ValidationError
from octtrain.runtime.backend import TorchBackend
from octtrain.train.finetune import FinetuneJob, run_finetune
from octtrain.train.job import RunResult
from tests.octtrain.finetune_fixtures import REPO, finetune_config, manifest_variant

# --- real runs ------------------------------------------------------------------------------------


def _records(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_tiny_pretrain_then_finetune(tiny_finetuned: RunResult) -> None:
    result = tiny_finetuned
    assert result.run_dir is not None and len(result.history) == 3
    assert [h["train_epoch/encoder_frozen"] for h in result.history] == [1.0, 0.0, 0.0]
    assert all(
        "val/balanced_accuracy" in h and "train_epoch/balanced_accuracy" in h
        for h in result.history
    )
    records = _records(result.run_dir)
    order = [
        ("train" if "train_epoch/balanced_accuracy" in r else "val", int(r["step"]))
        for r in records
        if "train_epoch/balanced_accuracy" in r or "val/balanced_accuracy" in r
    ]
    # Every epoch's train metrics are written before its validation starts.
    assert order == [("train", 1), ("val", 1), ("train", 2), ("val", 2), ("train", 3), ("val", 3)]
    val = [r for r in records if "val/balanced_accuracy" in r]
    assert all(r["val/samples"] == 8 for r in val)
    assert any("val_participant/balanced_accuracy" in r for r in records)
    assert all(f"val/predicted_share/{c}" in val[0] for c in ("healthy", "insulin_dependent"))
    assert "val/mean_entropy" in val[0] and "val/kappa" in val[0] and "val/macro_aupr" in val[0]
    images = sorted((result.run_dir / "images").glob("val_confusion_matrix_*.png"))
    assert len(images) == 3
    assert result.best_checkpoint is not None and Path(result.best_checkpoint).is_file()
    state = torch.load(result.best_checkpoint, weights_only=True)
    assert state["kind"] == "finetune" and state["epoch"] == result.best_unit
    assert state["init"]["encoder"] == "target_encoder"  # the EMA encoder by default


def test_wandb_offline_history_has_train_then_val_each_epoch(
    tiny_cache: tuple[Path, Path], tiny_pretrained: str, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    cfg = finetune_config(tiny_cache[0], run, "train.epochs=2", "logging.wandb_mode=offline")
    run_finetune(cfg, tiny_pretrained)
    (offline,) = (run / "wandb").glob("offline-run-*")
    wandb = Path(sys.executable).with_name("wandb")
    out = subprocess.run(
        [str(wandb), "leet", "inspect", str(offline), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    history = [
        r["history"]["item"]
        for r in map(json.loads, out.splitlines())
        if r.get("type") == "history"
    ]
    seen = []
    for item in history:
        if "train_epoch/balanced_accuracy" in item:
            seen.append(("train", item["train_epoch/step"]))
        if "val/balanced_accuracy" in item:
            seen.append(("val", item["val/step"]))
    # What W&B really recorded: no train metric dropped, train before val in every epoch.
    assert seen == [("train", 1), ("val", 1), ("train", 2), ("val", 2)]
    assert any(item.get("val/confusion_matrix._type") == "image-file" for item in history)
    assert any("val_participant/macro_auroc" in item for item in history)
    assert sum("train/loss" in item for item in history) >= 2


def _train_epoch(job: FinetuneJob, batches: Any, epoch: int) -> dict[str, float]:
    """One epoch of the job's steps, as the skeleton runs them; the epoch's metrics."""
    for i in range(job.steps_per_unit):
        step = epoch * job.steps_per_unit + i
        job.before_step(step)
        job.train_step(next(batches), step)
    return job.end_of_unit(epoch + 1)[0]


def test_unfreeze_epoch_changes_optimizer_groups_and_weights(
    tiny_cache: tuple[Path, Path], tiny_pretrained: str, tmp_path: Path
) -> None:
    cfg = finetune_config(
        tiny_cache[0], tmp_path / "run", "train.epochs=2", "schedule.unfreeze_epoch=1"
    )
    job = FinetuneJob(cfg, mf.load(tiny_cache[0]), tiny_pretrained, TorchBackend("cpu"))
    batches = iter(job.start(0))
    enc0 = {k: v.clone() for k, v in job.raw.encoder.state_dict().items()}
    head0 = {k: v.clone() for k, v in job.raw.head.state_dict().items()}
    assert {g["part"] for g in job.optimizer.param_groups} == {"head"}
    _train_epoch(job, batches, 0)
    enc1 = job.raw.encoder.state_dict()
    assert all(torch.equal(enc0[k], enc1[k]) for k in enc0)  # frozen: not one weight moved
    assert any(not torch.equal(head0[k], v) for k, v in job.raw.head.state_dict().items())
    groups_before = len(job.optimizer.param_groups)
    _train_epoch(job, batches, 1)  # its first step thaws the encoder
    parts = [g["part"] for g in job.optimizer.param_groups]
    assert len(parts) > groups_before and parts.count("encoder") == len(parts) - groups_before
    enc2 = job.raw.encoder.state_dict()
    assert all(not torch.equal(enc0[k], enc2[k]) for k in enc0 if k.endswith("weight"))


def test_gradient_accumulation_reaches_the_effective_batch(
    tiny_cache: tuple[Path, Path], tiny_pretrained: str, tmp_path: Path
) -> None:
    cfg = finetune_config(
        tiny_cache[0],
        tmp_path / "run",
        "optim.effective_batch_size=16",
        "schedule.unfreeze_epoch=0",
    )
    job = FinetuneJob(cfg, mf.load(tiny_cache[0]), tiny_pretrained, TorchBackend("cpu"))
    assert (job.accum, job.steps_per_unit) == (2, 2)  # 32 volumes = 2 steps of 2 x 8
    record = _train_epoch(job, iter(job.start(0)), 0)
    steps = {int(s["step"]) for s in job.optimizer.state.values()}
    assert steps == {2}  # 4 micro-batches, 2 optimizer steps
    assert record["train_epoch/samples"] == 32  # every micro-batch's predictions were scored


def test_architecture_mismatch_is_a_clear_error(
    tiny_cache: tuple[Path, Path], tiny_pretrained: str, tmp_path: Path
) -> None:
    cfg = finetune_config(tiny_cache[0], tmp_path / "run", "model.preset=small")
    with pytest.raises(CheckpointError, match=r"model.embed_dim: checkpoint 48, config 96"):
        run_finetune(cfg, tiny_pretrained)
    cfg = finetune_config(tiny_cache[0], tmp_path / "run2", "model.patch=[4,16,16]")
    with pytest.raises(CheckpointError, match=r"model.patch: checkpoint \[4, 8, 8\]"):
        run_finetune(cfg, tiny_pretrained)


def test_early_stopping_triggers(
    tiny_cache: tuple[Path, Path], tiny_pretrained: str, tmp_path: Path
) -> None:
    cfg = finetune_config(
        tiny_cache[0],
        tmp_path / "run",
        "train.epochs=6",
        "schedule.unfreeze_epoch=null",  # linear probe: frozen throughout
        "early_stopping.patience=1",
        "early_stopping.min_delta=2.0",  # no metric can improve by 2: stop after epoch 2
    )
    result = run_finetune(cfg, tiny_pretrained)
    assert result.stopped_early and len(result.history) == 2
    assert result.best_unit == 1
    assert all(h["train_epoch/encoder_frozen"] == 1.0 for h in result.history)


def test_single_class_validation_split(
    tiny_cache: tuple[Path, Path], tiny_pretrained: str, tmp_path: Path
) -> None:
    path = manifest_variant(
        tiny_cache[0], tmp_path, lambda vs: [v for v in vs if v.split != "val" or v.label == 2]
    )
    cfg = finetune_config(
        path,
        tmp_path / "run",
        "train.epochs=1",
        f"data.cache={tiny_cache[1]}",
        "early_stopping.metric=macro_auroc",  # undefined here: the score is NaN
    )
    result = run_finetune(cfg, tiny_pretrained)
    h = result.history[0]
    assert math.isnan(h["val/macro_auroc"])  # one class only: AUROC undefined, not a crash
    assert math.isnan(h["val/recall/healthy"]) and not math.isnan(h["val/recall/" + _G2])
    assert result.run_dir is not None
    alerts = [r for r in _records(result.run_dir) if r.get("event") == "alert"]
    assert any("has no" in a["text"] for a in alerts)  # the missing classes are announced
    # An undefined score is never the best checkpoint, and index.json stays JSON.
    text = (result.run_dir / "checkpoints" / "index.json").read_text()
    index = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in index.json"))
    assert index["best"] is None and result.best_checkpoint is None


_G2 = "oral_medication_and_or_non_insulin_injectable_medication_controlled"


def _break_one_val_volume(vols: list[mf.Volume]) -> list[mf.Volume]:
    i = next(i for i, v in enumerate(vols) if v.split == "val")
    # Gone from the cache, under its own participant's folder (the manifest check passes).
    gone = f"volumes/{vols[i].participant_id}/gone.ome.zarr"
    vols[i] = dataclasses.replace(vols[i], zarr_path=gone)
    return vols


def test_failing_validation_is_logged_and_training_goes_on(
    tiny_cache: tuple[Path, Path], tiny_pretrained: str, tmp_path: Path
) -> None:
    path = manifest_variant(tiny_cache[0], tmp_path, _break_one_val_volume)
    common = ["train.epochs=2", f"data.cache={tiny_cache[1]}"]
    result = run_finetune(finetune_config(path, tmp_path / "run", *common), tiny_pretrained)
    assert len(result.history) == 2 and result.validation_failures == 2
    assert result.best_unit is None
    assert result.run_dir is not None
    records = _records(result.run_dir)
    assert [int(r["step"]) for r in records if "train_epoch/loss" in r] == [1, 2]
    alerts = [r for r in records if r.get("event") == "alert" and "validation" in r["title"]]
    assert len(alerts) == 2 and "failed on process 0: " in alerts[0]["text"]
    strict = finetune_config(
        path, tmp_path / "run2", *common, "validation.continue_on_failure=false"
    )
    with pytest.raises(ValidationError, match=r"failed on process 0: .* not in the cache"):
        run_finetune(strict, tiny_pretrained)


WORKER = """
import json, sys
from octstage import manifest as mf
from octtrain.cli import setup_logging
from octtrain.config.loader import load_config
from octtrain.runtime.backend import make_backend
from octtrain.train.finetune import FinetuneJob, settings
from octtrain.train.loop import Trainer
from octtrain.config.finetune import FinetuneConfig

config, manifest, init, out, *overrides = sys.argv[1:]
setup_logging(False)
cfg = load_config(FinetuneConfig, config, [f"data.manifest={manifest}", *overrides])
backend = make_backend("cpu")
job = FinetuneJob(cfg, mf.load(manifest), init, backend)
result = Trainer(job, settings(job.cfg), backend).run()
weights = [float(p.detach().double().sum()) for p in job.raw.parameters()]
with open(f"{out}/rank{backend.rank}.json", "w") as fh:
    json.dump({"weights": weights, "history": result.history}, fh)
backend.close()
"""


@pytest.mark.slow
def test_two_processes_with_fewer_validation_samples_than_processes(
    tiny_cache: tuple[Path, Path], tiny_pretrained: str, tmp_path: Path
) -> None:
    keep = {"val": 1}

    def one_val(vols: list[mf.Volume]) -> list[mf.Volume]:
        out = []
        for v in vols:
            if v.split == "val":
                if not keep["val"]:
                    continue
                keep["val"] -= 1
            out.append(v)
        return out

    path = manifest_variant(tiny_cache[0], tmp_path, one_val)
    run = tmp_path / "run"
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += [str(worker), str(REPO / "configs/finetune/tiny.yaml"), str(path), tiny_pretrained]
    cmd += [str(tmp_path), f"data.cache={tiny_cache[1]}", f"train.run_dir={run}"]
    cmd += ["train.epochs=2", "schedule.unfreeze_epoch=1", "logging.console=false"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = _records(run)
    val = [r for r in records if "val/balanced_accuracy" in r]
    assert [r["val/samples"] for r in val] == [1, 1]  # counted once, no padded duplicate
    train = [r for r in records if "train_epoch/loss" in r]
    assert [r["train_epoch/encoder_frozen"] for r in train] == [1.0, 0.0]
    assert "encoder unfrozen" in proc.stderr
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    # After the unfreeze the encoder's gradients are averaged too: replicas stay identical.
    assert r0["weights"] == r1["weights"]
    key = "val/balanced_accuracy"
    assert r0["history"][1][key] == r1["history"][1][key]


@pytest.mark.parametrize("epoch", [1, 2])  # resumed into the thaw, and after it
def test_resume_reproduces_the_uninterrupted_epochs(
    tiny_cache: tuple[Path, Path], tiny_pretrained: str, tmp_path: Path, epoch: int
) -> None:
    manifest = tiny_cache[0]
    common = ["train.epochs=3", "schedule.unfreeze_epoch=1", "checkpoint.keep_last=3"]
    common += ["logging.log_every=1"]
    full = tmp_path / "full"
    run_finetune(finetune_config(manifest, full, *common), tiny_pretrained)
    saved = full / "checkpoints" / f"step_{4 * epoch:08d}.pt"  # 32 volumes / batch 8
    resumed = tmp_path / "resumed"
    result = run_finetune(
        finetune_config(manifest, resumed, *common, f"checkpoint.resume={saved}"),
        tiny_pretrained,
    )
    assert [h["unit"] for h in result.history] == [float(e) for e in range(epoch + 1, 4)]
    a, b = _records(full), _records(resumed)
    steps_a = {r["step"]: r["train/loss"] for r in a if "train/loss" in r}
    steps_b = {r["step"]: r["train/loss"] for r in b if "train/loss" in r}
    assert sorted(steps_b) == list(range(4 * epoch + 1, 13))
    assert [steps_a[s] for s in steps_b] == list(steps_b.values())
    for key in ("train_epoch/loss", "val/loss", "val/balanced_accuracy"):
        epochs_a = {r["step"]: r[key] for r in a if key in r and r["step"] > epoch}
        assert epochs_a == {r["step"]: r[key] for r in b if key in r}, key


class SimulatedSpmdHost(TorchBackend):
    """Host 0 of a 4-host, 16-chip SPMD pod, as the step sees it: this host loads its quarter of
    the global batch, the step gets the whole global batch, and values computed in the step are
    already global (no all-reduce). What host 0 broadcasts it keeps."""

    def __init__(self) -> None:
        super().__init__("cpu")
        self.process_index, self.process_count, self.world_size = 0, 4, 16
        self.rank, self.step_is_global = 0, True

    def reduce_step_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.clone()

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model  # SPMD shards the batch, it does not wrap the model

    def broadcast_object(self, obj: Any) -> Any:
        return obj


def test_a_pod_host_steps_on_the_global_batch_and_counts_every_sample(
    tiny_cache: tuple[Path, Path], tiny_pretrained: str, tmp_path: Path
) -> None:
    manifest = tiny_cache[0]
    cfg = finetune_config(manifest, tmp_path, "data.batch_size=16")
    job = FinetuneJob(cfg, mf.load(manifest), tiny_pretrained, SimulatedSpmdHost())
    host_batch = next(iter(job.start(0)))
    assert len(host_batch["label"]) == 4  # this host's quarter
    # The step sees the pod's global batch: the four hosts' shards (here this one four times).
    step_batch = {
        k: torch.cat([v] * 4) if isinstance(v, torch.Tensor) else v for k, v in host_batch.items()
    }
    for step in range(job.steps_per_unit):
        job.train_step(step_batch, step)
    metrics, _ = job.end_of_unit(1)
    assert metrics["train_epoch/samples"] == len(job.train_set) == 32


def test_prediction_collapse_alarm_and_grad_norm_in_finetuning(
    tiny_cache: tuple[Path, Path], tiny_pretrained: str, tmp_path: Path
) -> None:
    # 8 validation volumes over 4 classes: some class always takes >= 25% of the predictions.
    # The same holds for the 32 training samples' epoch histogram. A clip of 1e-6 clips every
    # step: a norm measured after clipping would be 1e-6.
    share = "validation.collapse_max_share=0.2"
    clip = 1e-6
    cfg = finetune_config(
        tiny_cache[0], tmp_path / "run", "train.epochs=1", share, f"optim.grad_clip={clip}"
    )
    result = run_finetune(cfg, tiny_pretrained)
    assert result.run_dir is not None
    records = _records(result.run_dir)
    alerts = [r["text"] for r in records if r.get("event") == "alert" and r["title"] == "collapse"]
    assert any(a.startswith("val, epoch 1: prediction collapse") for a in alerts), alerts
    assert any(a.startswith("train, epoch 1: prediction collapse") for a in alerts), alerts
    norms = [r["train/grad_norm"] for r in records if "train/grad_norm" in r]
    assert norms and all(n > 1000 * clip for n in norms)  # before clipping and zero_grad


def test_flash_with_a_length_its_blocks_cannot_take_is_refused_before_training(
    tiny_cache: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off a TPU ``choose`` never picks flash: pretend it did (as on a TPU) and finetune must
    refuse the encoder's token count before the first step, not fail in step 0's backward."""
    import octtrain.train.finetune as finetune_module

    monkeypatch.setattr(finetune_module, "choose", lambda *_: ("flash", "as on a TPU"))
    cfg = finetune_config(
        tiny_cache[0],
        tmp_path / "run",
        "init_encoder=random",
        "model.input_shape=[8,32,24]",
        "model.patch=[1,4,4]",
    )
    with pytest.raises(ConfigError, match="the encoder sees 384 tokens"):
        run_finetune(cfg, None)
    assert not list((tmp_path / "run").glob("checkpoints/step_*"))
