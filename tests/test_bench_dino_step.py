"""The DINOv2 step benchmark on a CPU with the tiny config: each arm steps the job
``octtrain pretrain`` builds, the FLOPs are counted, and a compiled arm computes what the eager
one does (the H100 figures in ``bench/results/dino-step-h100.*`` come from the same script)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_step_benchmark_times_each_arm_and_counts_the_steps_flops(tmp_path: Path) -> None:
    report = tmp_path / "step.json"
    cmd = [sys.executable, str(ROOT / "bench" / "bench_dino_step.py")]
    cmd += ["--config", str(ROOT / "configs" / "pretrain" / "dino-tiny.yaml")]
    cmd += ["--arms", "none,aot_eager", "--steps", "2", "--warmup", "1", "--device", "cpu"]
    cmd += ["--json", str(report), "train.cpu_threads=1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BENCH_PEAK_TFLOPS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    arms = json.loads(report.read_text())["arms"]
    assert [a["compile"] for a in arms] == ["none", "aot_eager"]
    assert arms[0]["flops"] > 1e8  # a tiny ViT's step, forward and backward, in FLOPs
    assert all(a["step_time_s"] > 0 and a["mfu"] > 0 for a in arms)
    # The same weights, batches and steps: a compiled step computes what the eager one does.
    assert arms[1]["last_loss"] == pytest.approx(arms[0]["last_loss"], rel=1e-4)
    assert "aot_eager: " in done.stdout and "x the none step" in done.stdout
