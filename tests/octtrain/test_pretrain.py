"""End to end on CPU with the tiny model: loss goes down, resume is exact, NaN stops the run."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import cv2
import pytest
import torch

from octtrain.cli import main
from octtrain.config.loader import load_config
from octtrain.config.pretrain import PretrainConfig
from octtrain.errors import DataError, NonFiniteLossError
from octtrain.runtime.checkpoint import load_checkpoint
from octtrain.train.pretrain import run_pretrain

TINY = Path(__file__).resolve().parents[2] / "configs" / "pretrain" / "tiny.yaml"
Cache = tuple[Path, Path]
FIXED_SET = [
    "data.max_samples=8",
    "data.augment.random_crop=false",
    "data.augment.flip_w=0",
    "data.augment.brightness=0",
    "data.augment.contrast=0",
]


def config(tiny_cache: Cache, run_dir: Path, *overrides: str) -> PretrainConfig:
    return load_config(
        PretrainConfig,
        TINY,
        [f"data.manifest={tiny_cache[0]}", f"train.run_dir={run_dir}", *overrides],
    )


def records(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def train_losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["train/loss"] for r in records(run_dir) if "train/loss" in r}


def test_tiny_model_loss_goes_down_on_a_fixed_set(tiny_cache: Cache, tmp_path: Path) -> None:
    cfg = config(
        tiny_cache,
        tmp_path / "run",
        *FIXED_SET,
        "train.max_steps=60",
        "logging.log_every=1",
        "checkpoint.every=60",
    )
    result = run_pretrain(cfg)
    losses = train_losses(tmp_path / "run")
    assert sorted(losses) == list(range(1, 61))
    first = sum(losses[s] for s in range(1, 6)) / 5
    last = sum(losses[s] for s in range(56, 61)) / 5
    # Targets that carry the image (models/inputs.py) are harder to predict than the legacy
    # position-dominated ones, whose loss fell by half in as many steps: it falls, more slowly.
    assert last < 0.95 * first, (first, last)
    assert result.last_checkpoint == str(tmp_path / "run" / "checkpoints" / "step_00000060.pt")
    rec = records(tmp_path / "run")
    assert all(r["train/grad_norm"] > 0 for r in rec if "train/grad_norm" in r)
    assert all(0 <= r["train/data_wait_frac"] <= 1 for r in rec if "train/data_wait_frac" in r)


def test_resume_reproduces_the_uninterrupted_run(tiny_cache: Cache, tmp_path: Path) -> None:
    common = [
        "train.max_steps=8",
        "checkpoint.every=4",
        "logging.log_every=1",
        "validation.every=4",
        "data.num_workers=2",
    ]
    full = tmp_path / "full"
    run_pretrain(config(tiny_cache, full, *common))
    resumed = tmp_path / "resumed"
    half = full / "checkpoints" / "step_00000004.pt"
    run_pretrain(config(tiny_cache, resumed, *common, f"checkpoint.resume={half}"))
    a, b = train_losses(full), train_losses(resumed)
    assert sorted(b) == [5, 6, 7, 8]
    assert [a[s] for s in range(5, 9)] == [b[s] for s in range(5, 9)]
    val_a = [r["val/loss"] for r in records(full) if r.get("step") == 8 and "val/loss" in r]
    val_b = [r["val/loss"] for r in records(resumed) if "val/loss" in r]
    assert val_a == val_b
    index = json.loads((full / "checkpoints" / "index.json").read_text())
    knn = {r["step"]: r["val/knn_balanced_accuracy"] for r in records(full) if "val/loss" in r}
    assert sorted(knn) == [4, 8]
    assert index["best"]["score"] == max(knn.values())  # the k-NN probe, not the loss
    assert index["best"]["step"] == max(knn, key=lambda s: (knn[s], -s))
    sa = load_checkpoint(str(full / "checkpoints"))
    sb = load_checkpoint(str(resumed / "checkpoints"))
    for key in ("encoder", "predictor", "target_encoder"):
        for name, tensor in sa[key].items():
            assert torch.equal(tensor, sb[key][name]), (key, name)


def test_non_finite_loss_stops_with_a_clear_error_and_keeps_checkpoints(
    tiny_cache: Cache, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    cfg = config(
        tiny_cache,
        run,
        "optim.lr=1e30",
        "schedule.warmup_steps=4",
        "optim.grad_clip=0",
        "checkpoint.every=1",
        "train.max_steps=20",
    )
    with pytest.raises(
        NonFiniteLossError, match=r"step \d+: loss .* Last good checkpoint: .*step_"
    ) as info:
        run_pretrain(cfg)
    assert "Lower the learning rate" in str(info.value)
    state = load_checkpoint(str(run / "checkpoints"))
    assert all(torch.isfinite(t).all() for t in state["encoder"].values())
    assert f"step {state['step'] + 1}:" in str(info.value)
    alerts = [r for r in records(run) if r.get("event") == "alert"]
    assert alerts and alerts[0]["title"] == "non-finite loss"


def test_cli_writes_config_code_version_metrics_and_checkpoints(
    tiny_cache: Cache, tmp_path: Path
) -> None:
    code = main(
        [
            "pretrain",
            "--config",
            str(TINY),
            "--manifest",
            str(tiny_cache[0]),
            f"train.output_dir={tmp_path}",
            "train.max_steps=3",
            "checkpoint.dir=None",
        ]
    )
    assert code == 0
    (run,) = tmp_path.iterdir()
    assert run.name.startswith("pretrain-")
    saved = load_config(PretrainConfig, run / "config.yaml", [])
    assert saved.model.input_shape == (8, 32, 32)  # resolved from the cache
    assert saved.train.max_steps == 3
    assert (run / "code_version").read_text().strip()
    assert train_losses(run)
    index = json.loads((run / "checkpoints" / "index.json").read_text())
    assert [e["step"] for e in index["checkpoints"]] == [3]


def test_manifest_of_another_cache_version_is_refused_clearly(
    tiny_cache: Cache, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = json.loads(tiny_cache[0].read_text())
    data["header"]["cache_version"] = 99
    bad = tmp_path / "manifest.json"
    bad.write_text(json.dumps(data))
    with caplog.at_level(logging.ERROR, logger="octtrain"):
        code = main(
            [
                "pretrain",
                "--config",
                str(TINY),
                "--manifest",
                str(bad),
                "--cache",
                str(tiny_cache[1]),
                f"train.output_dir={tmp_path}",
            ]
        )
    assert code == 4  # the data-error exit code
    assert "cache version 99" in caplog.text and "rebuild the cache" in caplog.text
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # refused before any run folder


def test_crop_larger_than_the_cache_is_refused(tiny_cache: Cache, tmp_path: Path) -> None:
    cfg = config(tiny_cache, tmp_path / "run", "model.input_shape=[16,64,64]")
    with pytest.raises(DataError, match=r"exceeds the cached shape \[8, 32, 32\]"):
        run_pretrain(cfg)


def test_checkpoints_to_gs_and_resume_auto_from_there(
    tiny_cache: Cache, tmp_path: Path, cloud_env: dict[str, str], gcs_bucket: str
) -> None:
    bucket_dir = f"gs://{gcs_bucket}/pretrain/ck"
    common = [f"checkpoint.dir={bucket_dir}", "checkpoint.every=2", "checkpoint.resume=auto"]
    first = run_pretrain(config(tiny_cache, tmp_path / "a", *common, "train.max_steps=2"))
    assert first.last_checkpoint == f"{bucket_dir}/step_00000002.pt"
    assert not (tmp_path / "a" / "checkpoints").exists()
    second = run_pretrain(config(tiny_cache, tmp_path / "b", *common, "train.max_steps=4"))
    assert second.last_checkpoint == f"{bucket_dir}/step_00000004.pt"
    assert sorted(train_losses(tmp_path / "b")) == [3, 4]  # continued, not restarted


def test_representation_pictures_from_the_first_step(tiny_cache: Cache, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run_pretrain(config(tiny_cache, run, "train.max_steps=2", "logging.image_every=1000"))
    logged = [r["images"] for r in records(run) if "images" in r]
    assert logged and logged[0]["train/target_features_pca"].endswith("_00000001.png")
    picture = cv2.imread(str(run / logged[0]["train/target_features_pca"]))
    assert picture.shape == (32, 32 * 2, 3)  # 2 layers of 4x4 patches of 8x8 pixels
    assert picture.reshape(-1, 3).std(axis=0).max() > 10  # not one flat colour
    attention = cv2.imread(str(run / logged[0]["train/target_attention"]))
    assert attention.shape == (32, 32, 3)  # one B-scan of the 8x32x32 volume
    red = attention[..., 2].astype(int) - attention[..., 1].astype(int)  # BGR: where it looks
    assert red.max() > 50


def test_a_run_that_clips_logs_the_norm_before_clipping_and_a_val_collapse_alarm(
    tiny_cache: Cache, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    clip = 1e-6  # every step clips: the norm after clipping would be this
    cfg = config(
        tiny_cache,
        run,
        "train.max_steps=2",
        "logging.log_every=1",
        "logging.console=false",
        "validation.every=2",
        f"optim.grad_clip={clip}",
        "validation.collapse_min_rank=1000",  # above any rank: the alarm must fire
    )
    run_pretrain(cfg)
    rec = records(run)
    norms = [r["train/grad_norm"] for r in rec if "train/grad_norm" in r]
    assert len(norms) == 2 and all(n > 1000 * clip for n in norms), norms
    alerts = [r["text"] for r in rec if r.get("event") == "alert" and r["title"] == "collapse"]
    assert any(a.startswith("val: representation collapse") for a in alerts), alerts
