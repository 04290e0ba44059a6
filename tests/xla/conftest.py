"""XLA tier fixtures: a tiny real cache, and trainer runs on XLA:CPU in their own processes.

torch_xla fixes its device count (``CPU_NUM_DEVICES``) and SPMD mode when its runtime starts,
once per process, so each run here is a fresh ``python -m tests.xla.<module>`` with its own
environment. The pytest process itself never imports torch_xla: what it reads back (checkpoints,
metrics.jsonl) must be usable without XLA. Runs are session fixtures shared by the assertions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.octtrain.tiny_cache import write_tiny_cache

REPO = Path(__file__).resolve().parents[2]
PRETRAIN_TINY = REPO / "configs" / "pretrain" / "tiny.yaml"
FINETUNE_TINY = REPO / "configs" / "finetune" / "tiny.yaml"
RESULT_PREFIX = "XLA-RESULT "
# A tiny run compiles 4 graphs of ~2-20 s each on 2 busy cores; a hang must still end.
RUN_TIMEOUT_S = 600
# XLA:CPU's LLVM optimisation is most of the compile time (measured 66 s -> 21 s for a tiny
# pretraining run); these tests check graphs and numbers, not XLA:CPU's speed.
FAST_COMPILE = "--xla_backend_optimization_level=0"
PRETRAIN_STEPS = 12
VAL_EVERY = 6
VAL_BATCH = 6  # per host; splits over the two devices of the mesh
VAL_VOLUMES = 8  # the tiny cache's val split
FINETUNE_EPOCHS = 4


@dataclass(frozen=True)
class XlaRun:
    """One finished subprocess: its ``XLA-RESULT`` line, run folder and metrics.jsonl records."""

    result: dict[str, Any]
    run_dir: Path | None
    records: list[dict[str, Any]]

    def series(self, key: str) -> dict[int, Any]:
        """``{step: value}`` of one metric over the run."""
        return {r["step"]: r[key] for r in self.records if key in r and "step" in r}


def run_xla(
    module: str,
    args: Sequence[str],
    devices: int,
    run_dir: Path | None,
    timeout_s: int = RUN_TIMEOUT_S,
    fast_compile: bool = True,
) -> XlaRun:
    """Run ``python -m tests.xla.<module> args`` on ``devices`` XLA:CPU devices (``fast_compile``:
    XLA:CPU's quick, slow-running code; off for runs of many steps)."""
    env = dict(os.environ)
    env.update(PJRT_DEVICE="CPU", CPU_NUM_DEVICES=str(devices), WANDB_MODE="disabled")
    if fast_compile:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {FAST_COMPILE}".strip()
    proc = subprocess.run(
        [sys.executable, "-m", f"tests.xla.{module}", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        pytest.fail(
            f"{module} {' '.join(args)} on {devices} XLA device(s) exited {proc.returncode}\n"
            f"--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    records = []
    if run_dir is not None:
        text = (run_dir / "metrics.jsonl").read_text(encoding="utf-8")
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
    return XlaRun(json.loads(lines[-1][len(RESULT_PREFIX) :]), run_dir, records)


@pytest.fixture(scope="session")
def xla_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(manifest, cache root): tests/octtrain's tiny cache, 48 volumes 8x32x32, 4 classes."""
    return write_tiny_cache(tmp_path_factory.mktemp("xla-cache"))


def pretrain(manifest: Path, run_dir: Path, devices: int) -> XlaRun:
    """configs/pretrain/tiny.yaml on XLA, fp32, a metrics record every step, two validations."""
    args = [
        "pretrain",
        "--config",
        str(PRETRAIN_TINY),
        "--manifest",
        str(manifest),
        f"train.run_dir={run_dir}",
        "train.device=xla",
        "train.precision=fp32",
        f"train.max_steps={PRETRAIN_STEPS}",
        f"validation.every={VAL_EVERY}",
        f"checkpoint.every={VAL_EVERY}",
        f"validation.batch_size={VAL_BATCH}",  # 8 volumes: a batch of 6, one of 2 + 4 fillers
        "data.batch_size=8",
        "data.num_workers=0",
        "logging.log_every=1",
        "logging.wandb_mode=disabled",
    ]
    return run_xla("driver", args, devices, run_dir)


@pytest.fixture(scope="session")
def pretrain_one_device(
    xla_cache: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> XlaRun:
    return pretrain(xla_cache[0], tmp_path_factory.mktemp("xla-pretrain-1"), devices=1)


@pytest.fixture(scope="session")
def pretrain_spmd(xla_cache: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> XlaRun:
    return pretrain(xla_cache[0], tmp_path_factory.mktemp("xla-pretrain-2"), devices=2)


@pytest.fixture(scope="session")
def finetune_spmd(
    xla_cache: tuple[Path, Path],
    pretrain_one_device: XlaRun,
    tmp_path_factory: pytest.TempPathFactory,
) -> XlaRun:
    """configs/finetune/tiny.yaml from the XLA pretraining checkpoint, SPMD over 2 devices, bf16:
    epoch 1 with the encoder frozen, epochs 2-4 unfrozen, validation after every epoch."""
    assert pretrain_one_device.run_dir is not None
    run_dir = tmp_path_factory.mktemp("xla-finetune-2")
    args = [
        "finetune",
        "--config",
        str(FINETUNE_TINY),
        "--manifest",
        str(xla_cache[0]),
        "--init",
        str(pretrain_one_device.run_dir / "checkpoints"),
        f"train.run_dir={run_dir}",
        "train.device=xla",
        "train.precision=bf16",
        f"train.epochs={FINETUNE_EPOCHS}",
        "schedule.unfreeze_epoch=1",
        "early_stopping.patience=100",
        "data.batch_size=8",
        "data.num_workers=0",
        "logging.log_every=1",
        "logging.wandb_mode=disabled",
    ]
    return run_xla("driver", args, devices=2, run_dir=run_dir)
