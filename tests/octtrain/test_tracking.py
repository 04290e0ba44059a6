"""Tracker: the same metrics to metrics.jsonl and a one-line console summary; no-op when off."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from octtrain.config.sections import LoggingConfig
from octtrain.runtime.tracking import Tracker, format_console


def test_metrics_go_to_jsonl_and_console_with_wandb_disabled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = LoggingConfig(wandb_mode="disabled")
    with (
        caplog.at_level(logging.INFO, logger="octtrain"),
        Tracker(cfg, tmp_path, enabled=True, config={"a": 1}, job_type="test") as tracker,
    ):
        tracker.log({"train/loss": 0.5, "train/lr": 1e-3}, step=1)
        tracker.log({"val/loss": 0.4}, step=1)
        tracker.log_images({"train/img": np.zeros((4, 6, 3), np.uint8)}, step=1)
        tracker.alert("stalled", "waiting for data")
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["train/loss"] == 0.5 and records[0]["step"] == 1
    assert records[1]["val/loss"] == 0.4
    assert (tmp_path / records[2]["images"]["train/img"]).is_file()
    assert records[3]["event"] == "alert" and records[3]["title"] == "stalled"
    assert not (tmp_path / "wandb").exists()
    lines = [r.getMessage() for r in caplog.records]
    assert "train step 1 | loss 0.5 | lr 0.001" in lines
    assert any("waiting for data" in line for line in lines)


def test_disabled_tracker_writes_nothing(tmp_path: Path) -> None:
    tracker = Tracker(LoggingConfig(), tmp_path / "run", enabled=False, config={}, job_type="t")
    tracker.log({"train/loss": 1.0}, step=1)
    tracker.close()
    assert not (tmp_path / "run").exists()


def test_console_line_shows_known_keys_only() -> None:
    line = format_console(5, {"train/loss": 0.25, "train/feat_std": 0.1, "train/samples": 40})
    assert line == "train step 5 | loss 0.25"
