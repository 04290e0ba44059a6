"""A real offline W&B run, read back with ``wandb leet inspect --json`` (wandb 0.31).

Proves what W&B really recorded: train metrics are committed before the first validation,
validation has its own step axis, the grad norm is positive and the lr never rises after warmup.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from octtrain.config.loader import load_config
from octtrain.config.pretrain import PretrainConfig
from octtrain.train.pretrain import run_pretrain

TINY = Path(__file__).resolve().parents[2] / "configs" / "pretrain" / "tiny.yaml"
WARMUP = 4


def inspect(run_folder: Path) -> list[dict[str, Any]]:
    wandb_bin = shutil.which("wandb") or str(Path(sys.executable).parent / "wandb")
    out = subprocess.run(
        [wandb_bin, "leet", "inspect", str(run_folder), "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.mark.slow
def test_offline_run_records_train_metrics_first_and_sane_curves(
    tiny_cache: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")  # the config leaves the mode to the environment
    run = tmp_path / "run"
    cfg = load_config(
        PretrainConfig,
        TINY,
        [
            f"data.manifest={tiny_cache[0]}",
            f"train.run_dir={run}",
            "logging.wandb_mode=null",
            "train.max_steps=12",
            "logging.log_every=2",
            "validation.every=6",
            f"schedule.warmup_steps={WARMUP}",
            "logging.image_every=6",
        ],
    )
    run_pretrain(cfg)
    (run_folder,) = (run / "wandb").glob("offline-run-*")
    records = inspect(run_folder)

    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    train = [h for h in history if "train/loss" in h]
    val = [h for h in history if "val/loss" in h]
    assert [h["train/step"] for h in train] == [1, 2, 4, 6, 8, 10, 12]
    assert [h["val/step"] for h in val] == [6, 12]
    first_val = history.index(val[0])
    assert any("train/loss" in h for h in history[:first_val])  # train shows up before val
    assert all(h["train/grad_norm"] > 0 for h in train)
    after_warmup = [h["train/lr"] for h in train if h["train/step"] - 1 >= WARMUP]
    assert len(after_warmup) >= 4
    assert all(b <= a for a, b in itertools.pairwise(after_warmup))
    for key in (
        "train/data_wait_s",
        "train/step_time_s",
        "train/samples_per_s",
        "train/ema_momentum",
        "train/weight_decay",
        "train/feat_std",
        "train/feat_erank",
    ):
        assert all(key in h for h in train), key
    assert any("train/input_mask.path" in h for h in history)

    metrics = {
        r["metric"].get("glob_name") or r["metric"].get("name"): r["metric"]
        for r in records
        if r["type"] == "metric"
    }
    assert metrics["val/*"]["step_metric"] == "val/step"
    assert metrics["train/*"]["step_metric"] == "train/step"
    assert any(r["type"] == "exit" for r in records)
