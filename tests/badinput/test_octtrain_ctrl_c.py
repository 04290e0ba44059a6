"""Ctrl-C in each octtrain command that works for a while (pretrain: test_octtrain_inputs.py),
sent to the whole process group as a terminal sends it (DataLoader workers included): exit 130,
one line, no traceback, no hang."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from octtrain import cli
from tests.badinput.conftest import start_as_at_a_terminal
from tests.badinput.test_octtrain_inputs import FINETUNE, ROOT, assert_clean, pristine

__all__ = ["pristine"]


def _interrupted(
    args: list[str], marker: str | None, after_s: float, then_s: float = 0.0
) -> subprocess.CompletedProcess[str]:
    """Run ``octtrain ARGS`` in its own process group; Ctrl-C the group ``then_s`` seconds
    after ``marker`` was printed (or once ``after_s`` seconds passed)."""
    proc = start_as_at_a_terminal("octtrain.cli", args, ROOT)
    assert proc.stdout is not None
    seen, started = b"", time.monotonic()
    os.set_blocking(proc.stdout.fileno(), False)
    while proc.poll() is None and time.monotonic() - started < 240:
        seen += proc.stdout.read() or b""
        if (marker and marker.encode() in seen) or (
            not marker and time.monotonic() - started > after_s
        ):
            break
        time.sleep(0.02)
    time.sleep(then_s)
    assert proc.poll() is None, seen.decode(errors="replace")[-2000:]  # still working
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=60)  # a hang fails here
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    os.set_blocking(proc.stdout.fileno(), True)
    seen += proc.stdout.read() or b""
    return subprocess.CompletedProcess(args, proc.returncode, seen.decode(errors="replace"), "")


def test_ctrl_c_in_finetune_as_it_prints_its_split_sizes(pristine: Path, tmp_path: Path) -> None:
    args = ["finetune", "--config", str(FINETUNE), "--manifest", str(pristine / "manifest.json"),
            f"train.output_dir={tmp_path}", "init_encoder=random", "data.num_workers=2",
            "train.epochs=1000"]  # fmt: skip
    # Right after the split sizes come the first steps and the first validation, whose loader
    # forks its workers: a Ctrl-C that lands in a __del__ or an at-fork hook there is dropped
    # by Python, and the run went on (issue 29: "hangs forever", 3 of 6 tries; here ~1 in 10
    # tries at these delays, on a terminal). The moment varies from run to run.
    for then_s in (0.0, 0.1, 0.2, 0.3, 0.4):
        assert_clean(_interrupted(args, "train / ", 0, then_s), 130, "interrupted")


@pytest.fixture(scope="module")
def finetuned(pristine: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("ft") / "run"
    args = ["finetune", "--config", str(FINETUNE), "--manifest", str(pristine / "manifest.json"),
            f"train.run_dir={run}", "init_encoder=random", "train.epochs=1"]  # fmt: skip
    assert cli.main(args) == 0
    return run / "checkpoints"


@pytest.mark.parametrize(
    "command",
    [
        ["evaluate", "evaluate: ", "--bootstrap", "200000", "--device", "cpu"],
        ["probe", "features:", "--epochs", "100000", "--device", "cpu"],
    ],
    ids=["evaluate", "probe"],
)
def test_ctrl_c_in_evaluate_and_probe(
    pristine: Path, finetuned: Path, tmp_path: Path, command: list[str]
) -> None:
    manifest, out = str(pristine / "manifest.json"), str(tmp_path / "out")
    args = [command[0], "--checkpoint", str(finetuned), "--manifest", manifest, "--out", out,
            *command[2:]]  # fmt: skip
    done = _interrupted(args, command[1], 0)
    assert_clean(done, 130, "interrupted")
    assert not list((tmp_path / "out").glob(".report-*"))  # no half report left
