"""A Ctrl-C that Python drops (raised inside a ``__del__`` or an at-fork hook: "Exception
ignored in ...") still ends the trainer's loops: ``finetune`` went on training after a Ctrl-C
as it started its loaders (issue 29: "hangs forever")."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from octtrain.data.loaders import Prefetcher
from octtrain.runtime.interrupt import check_interrupted, remembered_ctrl_c


class CtrlCInDel:
    """Ctrl-C arrives while this object's ``__del__`` runs: Python raises KeyboardInterrupt
    there, prints "Exception ignored in" and drops it (as in a DataLoader iterator's
    ``__del__``, or the logging module's at-fork hook, where finetune lost it)."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the handler runs between these bytecodes
            pass


def drop_a_ctrl_c() -> None:
    obj = CtrlCInDel()
    del obj
    gc.collect()


@pytest.fixture
def python_sigint() -> Iterator[None]:
    """SIGINT at Python's own handler (a test run in the background may have it ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


# The KeyboardInterrupt dropped in ``__del__`` is what these tests make: pytest reports it.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def test_a_dropped_ctrl_c_ends_the_prefetcher_at_its_next_batch(python_sigint: None) -> None:
    batches = [{"x": i} for i in range(100)]
    with remembered_ctrl_c():
        prefetcher = Prefetcher(batches)
        try:
            assert next(prefetcher) == {"x": 0}
            drop_a_ctrl_c()  # printed "Exception ignored", raised nothing here
            with pytest.raises(KeyboardInterrupt):
                next(prefetcher)
            with pytest.raises(KeyboardInterrupt):  # and every later wait: it is not forgotten
                next(prefetcher)
        finally:
            prefetcher.close()
    check_interrupted()  # the block is over: nothing is pending any more


def test_outside_the_block_nothing_is_remembered(python_sigint: None) -> None:
    drop_a_ctrl_c()
    check_interrupted()  # Python's own handler: the dropped Ctrl-C is gone (as before)


@pytest.mark.parametrize("mode", ["plain", "interrupted"])
def test_a_dying_workers_broken_handshake_prints_no_traceback(mode: str) -> None:
    # CI (Python 3.12): a DataLoader worker ended by the terminal's Ctrl-C broke the resource-
    # sharer's handshake, whose thread printed a ConnectionResetError traceback after
    # "interrupted". Without a Ctrl-C ("plain") the same break still prints it: the worker
    # really breaks the connection, and only the interrupt's echo is quieted.
    worker = Path(__file__).with_name("sharer_reset_worker.py")
    env = {**os.environ, "PYTHONPATH": str(worker.parents[2])}
    proc = subprocess.run(
        [sys.executable, str(worker), mode], capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr
    if mode == "plain":
        assert "resource_sharer" in proc.stderr  # the sharer's traceback
        assert "a thread's own" in proc.stderr  # the plain thread's
    else:
        assert "Traceback" not in proc.stderr, proc.stderr
