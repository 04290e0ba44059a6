"""Every exit path of a data-bound training loop ends its process, in bounded time.

Each path runs ``exit_path_worker.py`` in its own process: the loop always waits for data, and
batches reach it through a thread that, like torch_xla's loader, is joined with no timeout at
close. Without the prefetcher ending its iteration once closed, that join waits forever on a
batch nothing will put (issue 30); here every path must end within ``BOUND_S``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from octtrain import exitcodes

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "octtrain" / "exit_path_worker.py"
SLOW = pytest.mark.slow
BOUND_S = 60  # startup (torch import) plus 6 batches of 0.2 s, on a busy 2-core machine


@pytest.mark.parametrize(
    ("path", "code", "says"),
    [
        # One path in the default tier (a process each: ~9 s on 2 busy cores), the rest slow.
        ("checkpoint", exitcodes.REFUSED.code, "PermissionError: gs://bucket/ckpt: HTTP 401"),
        pytest.param("finished", exitcodes.OK.code, "", marks=SLOW),
        pytest.param("data", exitcodes.DATA.code, "volume 2: unreadable chunk", marks=SLOW),
        pytest.param("nonfinite", exitcodes.NONFINITE.code, "", marks=SLOW),
        pytest.param("validation", exitcodes.REFUSED.code, "volume 9: short read", marks=SLOW),
        pytest.param("interrupt", exitcodes.INTERRUPTED.code, "", marks=SLOW),
    ],
)
def test_every_exit_path_of_a_data_bound_loop_ends_the_process(
    tmp_path: Path, path: str, code: int, says: str
) -> None:
    started = time.monotonic()
    proc = run_worker(tmp_path, path)
    assert proc.returncode == code, proc.stdout + proc.stderr[-3000:]
    assert f"EXIT {code}" in proc.stdout and says in proc.stdout, proc.stdout
    assert time.monotonic() - started < BOUND_S


def test_a_close_that_never_returns_ends_through_the_watchdog(tmp_path: Path) -> None:
    """The trainer closes the backend before it stops the watchdog: a device wait at close
    whose peers are gone ends the process with exit 5, naming the phase (stopped first, the
    watchdog would leave the process waiting forever)."""
    proc = run_worker(tmp_path, "close")
    assert proc.returncode == exitcodes.STALLED.code, proc.stdout + proc.stderr[-3000:]
    assert "EXIT" not in proc.stdout  # ended by the watchdog, inside the trainer's close
    assert "(waiting in closing the backend)" in proc.stderr, proc.stderr[-3000:]


def test_a_call_that_never_returns_at_close_exits_5_naming_it() -> None:
    """``within_or_exit`` (XLA's device wait at close): past its limit the process ends."""
    code = (
        "import threading\n"
        "from octtrain.runtime.handoff import within_or_exit\n"
        "within_or_exit(threading.Event().wait, 0.5, 'the device wait')\n"
        "print('returned')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=20
    )  # a light import: seconds
    assert proc.returncode == exitcodes.STALLED.code, proc.stdout + proc.stderr
    assert "returned" not in proc.stdout
    assert "the device wait did not return within 0.5 s: exiting with code 5" in proc.stderr


ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


def run_worker(tmp_path: Path, path: str) -> subprocess.CompletedProcess[str]:
    """exit_path_worker.py driven to ``path``; a failure if it does not end within BOUND_S."""
    try:
        return subprocess.run(
            [sys.executable, str(WORKER), str(tmp_path / "run"), path],
            env=ENV,
            capture_output=True,
            text=True,
            timeout=BOUND_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{path}: the process did not end within {BOUND_S} s: {exc.stdout!r}")
