"""DINOv2 as a job of the one training skeleton, on a tiny Cell Painting cache: losses logged
per part, data wait logged, pictures at the first step, checkpoints and resume."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from octtrain.config.dino import DinoConfig, job_of
from octtrain.config.loader import load_config
from octtrain.errors import CheckpointError, ConfigError, DataError
from octtrain.runtime.backend import make_backend
from octtrain.runtime.torch_backend import TorchBackend
from octtrain.train.dino import (
    DinoJob,
    collapse_entropies,
    refuse_multihost_xla,
    teacher_temperature,
)
from octtrain.train.job import RunResult, Settings
from octtrain.train.loop import Trainer
from tests.octtrain.cell_cache import CellField, write_cell_cache

ROOT = Path(__file__).resolve().parents[2]
DINO_TINY = ROOT / "configs" / "pretrain" / "dino-tiny.yaml"


@pytest.fixture(scope="module")
def cell_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[CellField]]:
    root = tmp_path_factory.mktemp("cells")
    return root, write_cell_cache(root)


def _run(root: Path, fields: list[CellField], overrides: list[str]) -> tuple[DinoJob, RunResult]:
    cfg = load_config(DinoConfig, DINO_TINY, overrides)
    backend = make_backend("cpu")
    train = [f for f in fields if f.split == "train"]
    job = DinoJob(cfg, train, root, backend)
    return job, Trainer(job, Settings.of(cfg), backend).run()  # type: ignore[arg-type]


def test_dino_runs_in_the_skeleton_with_pictures_at_the_first_step(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    root, fields = cell_cache
    run = tmp_path / "run"
    _, result = _run(root, fields, [f"train.run_dir={run}", "logging.log_every=1"])
    assert result.steps == 6 and result.last_loss is not None
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    for r in train:
        assert {"train/dino_loss", "train/ibot_loss", "train/koleo_loss"} <= r.keys()
        assert "train/data_wait_s" in r and "train/feat_erank" in r
        assert 0 <= r["train/teacher_entropy"] <= math.log(64) + 1e-6  # 64 prototypes
        assert 0 <= r["train/teacher_batch_entropy"] <= math.log(64) + 1e-6
        parts = r["train/dino_loss"] + r["train/ibot_loss"] + 0.1 * r["train/koleo_loss"]
        assert r["train/loss"] == pytest.approx(parts, rel=1e-4)
    images = [r for r in records if "images" in r]
    assert images and images[0]["step"] == 1  # the first step, not iteration 1,000
    for key in ("train/attention", "train/features_pca", "train/input_channels"):
        assert (run / images[0]["images"][key]).stat().st_size > 0
    index = json.loads((run / "checkpoints" / "index.json").read_text())
    assert [e["step"] for e in index["checkpoints"]] == [3, 6]


def test_sinkhorn_knopp_teacher_spreads_every_batch_over_the_prototypes(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    root, fields = cell_cache
    run = tmp_path / "run"
    overrides = [f"train.run_dir={run}", "logging.log_every=1", "dino.centering=sinkhorn_knopp"]
    _, result = _run(root, fields, overrides)
    assert result.steps == 6 and result.last_loss is not None and math.isfinite(result.last_loss)
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for r in (r for r in records if "train/loss" in r):
        # Equal prototype shares from the first step: the batch-mean target is ~uniform.
        assert r["train/teacher_batch_entropy"] > math.log(64) - 0.05


def test_resume_continues_from_the_checkpoint_with_teacher_and_centres(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    root, fields = cell_cache
    run = tmp_path / "run"
    base = [f"train.run_dir={run}", f"checkpoint.dir={tmp_path / 'ckpt'}"]
    first, _ = _run(root, fields, [*base, "train.max_steps=3"])
    saved_center = first.center.clone()
    assert saved_center.abs().sum() > 0  # the centre moved from zero
    resumed, result = _run(root, fields, [*base, "checkpoint.resume=auto"])
    assert result.steps == 6
    state = torch.load(tmp_path / "ckpt" / "step_00000006.pt", weights_only=False)
    assert state["kind"] == "dino" and state["step"] == 6
    assert not torch.equal(state["center"], saved_center)
    with pytest.raises(CheckpointError, match="model config differs"):
        _run(root, fields, [*base, "checkpoint.resume=auto", "model.depth=3"])
    # another teacher temperature would go on under the checkpoint's targets: refused too
    with pytest.raises(CheckpointError, match=r"dino config differs.*teacher_temp"):
        _run(root, fields, [*base, "checkpoint.resume=auto", "dino.teacher_temp=0.06"])
    del resumed


def test_collapse_entropies_tell_the_two_collapses_apart() -> None:
    one_hot = torch.zeros(8, 4)
    one_hot[:, 2] = 1.0  # every crop on one prototype
    uniform = torch.full((8, 4), 0.25)
    collapsed, flat = collapse_entropies(one_hot), collapse_entropies(uniform)
    assert collapsed["train/teacher_batch_entropy"] == pytest.approx(0.0, abs=1e-6)
    assert flat["train/teacher_entropy"] == pytest.approx(math.log(4))
    assert flat["train/teacher_batch_entropy"] == pytest.approx(math.log(4))


def test_teacher_temperature_warms_up_linearly() -> None:
    temps = ["dino.warmup_teacher_temp=0.04", "dino.teacher_temp=0.07"]
    cfg = load_config(DinoConfig, DINO_TINY, ["dino.warmup_teacher_temp_steps=10", *temps])
    assert teacher_temperature(0, cfg) == pytest.approx(0.04)
    assert teacher_temperature(5, cfg) == pytest.approx(0.055)
    assert teacher_temperature(10, cfg) == pytest.approx(0.07)


def test_pretrain_configs_name_their_job(tmp_path: Path) -> None:
    assert job_of(DINO_TINY, []) == "dino"
    assert job_of(ROOT / "configs" / "pretrain" / "tiny.yaml", []) == "jepa"
    with pytest.raises(ConfigError, match="job 'mae' unknown"):
        job_of(DINO_TINY, ["job=mae"])
    with pytest.raises(ConfigError, match="not divisible by model patch"):
        load_config(DinoConfig, DINO_TINY, ["crops.local_size=18"])


def test_cli_dino_on_an_oct_manifest_is_a_data_error_exit_4(
    tiny_cache: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from octtrain.cli import main

    code = main(
        [
            "pretrain",
            "--config",
            str(DINO_TINY),
            "--manifest",
            str(tiny_cache[0]),
            f"train.run_dir={tmp_path / 'run'}",
        ]
    )
    assert code == 4  # a manifest that cannot feed the run: a data error
    # Both sides named: the kind the job reads and the kind found, and the file.
    assert "expected a manifest of kind 'cellpainting', found kind 'oct'" in caplog.text
    assert str(tiny_cache[0]) in caplog.text and "octstage build-cache" in caplog.text


def test_cli_pretrain_then_profile_on_a_cell_painting_manifest(tmp_path: Path) -> None:
    from octtrain.cli import main

    root = tmp_path / "cache"
    root.mkdir()
    write_cell_cache(root, n=24, splits=("train",) * 8 + ("val",) * 16)  # P1, P2 held out
    manifest = root / "manifest.json"
    run = tmp_path / "run"
    code = main(
        [
            "pretrain",
            "--config",
            str(DINO_TINY),
            "--manifest",
            str(manifest),
            f"train.run_dir={run}",
            "train.max_steps=2",
            "checkpoint.every=2",
        ]
    )
    assert code == 0
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "images" in r] == [1]
    ckpt = run / "checkpoints" / "step_00000002.pt"
    code = main(["profile", "--checkpoint", str(ckpt), "--manifest", str(manifest)])
    assert code == 0
    report = json.loads((ckpt.parent / "profile.json").read_text())
    assert report["fields"] == 16 and report["plates"] == ["P1", "P2"]  # held-out plates only
    randoms = {f"random_init_{i}" for i in range(3)}
    tokens = {f"{name}_tokens" for name in randoms | {"dino"}}
    baselines = {"handcrafted", "cp_measure", "statistics", "noise_floor"}
    assert set(report["encoders"]) == {"dino"} | randoms | tokens | baselines


def test_validation_scores_the_teacher_s_well_profiles_on_the_validation_plate(
    tmp_path: Path,
) -> None:
    root = tmp_path / "cells"
    root.mkdir()
    fields = write_cell_cache(root, splits=("train",) * 8 + ("val",) * 8)  # plate P1: val
    train, val = ([f for f in fields if f.split == s] for s in ("train", "val"))
    run = tmp_path / "run"
    cfg = load_config(DinoConfig, DINO_TINY, [f"train.run_dir={run}", "validation.every=3"])
    backend = make_backend("cpu")
    job = DinoJob(cfg, train, root, backend, val)
    result = Trainer(job, Settings.of(cfg), backend).run()  # type: ignore[arg-type]
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    scored = [r for r in records if "val/activity_map" in r]
    assert [r["step"] for r in scored] == [3, 6]
    for r in scored:
        assert 0.0 <= r["val/activity_map"] <= 1.0
        assert r["val/wells"] == 4.0  # P1's four wells, not a field of the training plate
        assert 0.0 <= r["val/well_probe_knn_balanced_accuracy"] <= 1.0
    best = max(scored, key=lambda r: r["val/activity_map"])
    assert result.best_score == pytest.approx(best["val/activity_map"])
    index = json.loads((run / "checkpoints" / "index.json").read_text())
    assert index["best"]["step"] == result.best_unit


def test_validation_without_profiled_fields_is_refused_before_training(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    root, fields = cell_cache
    cfg = load_config(DinoConfig, DINO_TINY, [f"train.run_dir={tmp_path}", "validation.every=3"])
    train = [f for f in fields if f.split == "train"]
    with pytest.raises(DataError, match=r"validation\.every=3 but split 'val' has no fields"):
        DinoJob(cfg, train, root, make_backend("cpu"), ())


def test_validation_needs_control_and_treated_wells_on_the_validation_plates(
    tmp_path: Path,
) -> None:
    root = tmp_path / "cells"
    root.mkdir()
    fields = write_cell_cache(root, splits=("train",) * 8 + ("val",) * 8)
    train = [f for f in fields if f.split == "train"]
    only_controls = [f for f in fields if f.split == "val" and f.is_control]
    cfg = load_config(DinoConfig, DINO_TINY, [f"train.run_dir={tmp_path}", "validation.every=3"])
    with pytest.raises(DataError, match="has no treated wells"):
        DinoJob(cfg, train, root, make_backend("cpu"), only_controls)


def test_validation_without_copairs_is_refused_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An H100 run whose environment lacked copairs trained, then died at its first validation
    with a traceback and no checkpoint of the unit: now it is refused at the start."""
    root = tmp_path / "cells"
    root.mkdir()
    fields = write_cell_cache(root, splits=("train",) * 8 + ("val",) * 8)
    train, val = ([f for f in fields if f.split == s] for s in ("train", "val"))
    cfg = load_config(DinoConfig, DINO_TINY, [f"train.run_dir={tmp_path}", "validation.every=3"])
    monkeypatch.setitem(sys.modules, "copairs", None)  # what find_spec reports as not installed
    with pytest.raises(ConfigError, match=r"validation\.every=3 scores .* copairs, which is not"):
        DinoJob(cfg, train, root, make_backend("cpu"), val)
    off = load_config(DinoConfig, DINO_TINY, [f"train.run_dir={tmp_path}", "validation.every=0"])
    DinoJob(off, train, root, make_backend("cpu"), ())  # no validation: copairs is not needed


def test_peak_device_memory_is_logged_where_the_backend_counts_it(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CPU keeps no allocator peak (no key, not a made-up 0); a CUDA backend's peak is logged
    with every timing window (stood in for by the backend's own method here: no GPU in CI)."""
    root, fields = cell_cache
    _run(root, fields, [f"train.run_dir={tmp_path / 'cpu'}", "logging.log_every=2"])
    lines = (tmp_path / "cpu" / "metrics.jsonl").read_text().splitlines()
    assert not any("train/peak_memory_gib" in json.loads(x) for x in lines)
    assert make_backend("cpu").peak_memory_gib() is None
    monkeypatch.setattr(TorchBackend, "peak_memory_gib", lambda self: 1.5)
    _run(root, fields, [f"train.run_dir={tmp_path / 'gpu'}", "logging.log_every=2"])
    records = [
        json.loads(x) for x in (tmp_path / "gpu" / "metrics.jsonl").read_text().split("\n") if x
    ]
    timed = [r for r in records if "train/step_time_s" in r]
    assert timed and all(r["train/peak_memory_gib"] == 1.5 for r in timed)


def test_dino_on_xla_with_several_processes_is_refused_before_anything_is_built(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    """Multi-host XLA would score the wrong iBOT tokens and track a fraction of the centre
    (docs/tpu-runbook.md): refused, naming the backends that run DINO. The backend double
    answers as a 2-host XLA job would; nothing of it is used before the refusal."""
    root, fields = cell_cache
    cfg = load_config(DinoConfig, DINO_TINY, [f"train.run_dir={tmp_path}"])
    train = [f for f in fields if f.split == "train"]
    backend = TorchBackend("cpu")
    backend.kind, backend.process_count = "xla", 2
    with pytest.raises(
        ConfigError, match=r"job 'dino' on XLA with 2 processes: not supported"
    ) as e:
        DinoJob(cfg, train, root, backend)
    for supported in ("torch CPU or CUDA", "parallel=ddp or fsdp", "XLA with one process"):
        assert supported in str(e.value)
    backend.process_count = 1  # one XLA process (one host's devices) is supported
    refuse_multihost_xla(backend)  # no refusal


def test_training_fields_of_different_channel_counts_are_refused(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    """One field of four stains among fields of five: one model cannot read both, so the job
    refuses before it builds one (instead of an error deep in the first batch)."""
    root, fields = cell_cache
    train = [f for f in fields if f.split == "train"]
    odd = dataclasses.replace(train[0], shape=(4, *train[0].shape[1:]))
    cfg = load_config(DinoConfig, DINO_TINY, [f"train.run_dir={tmp_path / 'run'}"])
    with pytest.raises(DataError, match=r"different channel counts: \[4, 5\]"):
        DinoJob(cfg, [odd, *train[1:]], root, make_backend("cpu"))


def test_a_step_without_a_masked_token_leaves_the_ibot_centre(
    cell_cache: tuple[Path, list[CellField]], tmp_path: Path
) -> None:
    """The iBOT centre is the EMA of the teacher's logits over masked tokens: a step with none
    (a batch whose crops drew no mask) has nothing to average and must not pull it to zero."""
    root, fields = cell_cache
    cfg = load_config(DinoConfig, DINO_TINY, [f"train.run_dir={tmp_path / 'run'}"])
    job = DinoJob(cfg, [f for f in fields if f.split == "train"], root, make_backend("cpu"))
    job.ibot_center = torch.full_like(job.ibot_center, 0.5)
    prototypes = job.ibot_center.shape[-1]
    job._update_centers(torch.zeros_like(job.center), torch.zeros(prototypes + 1))
    assert torch.equal(job.ibot_center, torch.full_like(job.ibot_center, 0.5))
    seen = torch.cat([torch.full((prototypes,), 2.0), torch.tensor([1.0])])  # one masked token
    job._update_centers(torch.zeros_like(job.center), seen)
    assert (job.ibot_center > 0.5).all()  # moved toward that token's logits
