"""A Ctrl-C that Python drops (raised inside a ``__del__`` or an at-fork hook: "Exception
ignored in ...") still ends the trainer's loops: ``finetune`` went on training after a Ctrl-C
as it started its loaders (issue 29: "hangs forever")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from octtrain.data.loaders import Prefetcher
from octtrain.runtime import interrupt as interrupt_module
from octtrain.runtime.interrupt import (
    agreed_ctrl_c,
    caused_by_ctrl_c,
    check_interrupted,
    interrupt_pending,
    remembered_ctrl_c,
)
from tests.octtrain.ctrl_c_in_del import drop_a_ctrl_c


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


def run_script(script: str) -> subprocess.CompletedProcess[str]:
    """``python -c script`` in a fresh interpreter (its own signal handlers and hooks)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env
    )


@pytest.mark.parametrize("mode", ["interrupted", "plain"])
def test_a_dropped_ctrl_c_is_raised_again_without_a_traceback(mode: str) -> None:
    """CI (Python 3.12): a Ctrl-C landed in the import lock's weakref callback; Python printed
    "Exception ignored in" and its traceback above "interrupted". The dropped interrupt is
    raised again at the next check, so its report goes to the debug log; another exception
    dropped after the Ctrl-C (``plain``: a ``__del__``'s own ValueError) is still printed."""
    script = (
        "import gc, signal\n"
        "from octtrain.runtime.interrupt import check_interrupted, remembered_ctrl_c\n"
        "from tests.octtrain.ctrl_c_in_del import drop_a_ctrl_c\n"
        # A shell without job control (CI's, in the background) starts it with SIGINT ignored.
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "class Fails:\n"
        "    def __del__(self): raise ValueError('a finalizer of its own')\n"
        "with remembered_ctrl_c():\n"
        "    drop_a_ctrl_c()\n"
        f"    if {mode == 'plain'}:\n"
        "        obj = Fails(); del obj; gc.collect()\n"
        "    try:\n"
        "        check_interrupted()\n"
        "    except KeyboardInterrupt:\n"
        "        print('interrupted')\n"
    )
    proc = run_script(script)
    assert proc.returncode == 0 and "interrupted" in proc.stdout, proc.stderr
    assert "KeyboardInterrupt" not in proc.stderr, proc.stderr
    if mode == "plain":
        assert "a finalizer of its own" in proc.stderr, proc.stderr
    else:
        assert proc.stderr == "", proc.stderr


def ctrl_c() -> None:
    """A Ctrl-C on this process, its handler run before this returns."""
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)  # the handler runs at the next bytecode; the sleep makes it certain


def test_on_a_pod_a_first_ctrl_c_waits_for_the_hosts_agreement(python_sigint: None) -> None:
    """Within ``agreed_ctrl_c`` (several hosts) a first Ctrl-C raises nothing anywhere (not
    even in a data wait's check): it is a flag ``hosts.agree`` carries to every host. A second
    one stops this host at once; one no agreement carried is forgotten at the block's end."""
    with remembered_ctrl_c():
        with agreed_ctrl_c(2):
            ctrl_c()
            assert interrupt_pending()
            check_interrupted()  # the loop's and the prefetcher's checks wait for the agreement
            with pytest.raises(KeyboardInterrupt):
                ctrl_c()  # again: this host alone, now
        assert not interrupt_pending()  # the run had finished: nothing left to raise
        # One host: nothing to agree with, Python's behaviour.
        with agreed_ctrl_c(1), pytest.raises(KeyboardInterrupt):
            ctrl_c()


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


def test_a_loader_worker_is_quiet_about_its_main_process_going_away_from_its_start() -> None:
    """The worker side of the same race: when the main process ends first, a worker's sharer
    thread breaks before the worker's own SIGINT handler ran. Every loader worker starts with
    the echoes quiet (``quiet_worker_echoes``), other errors still printed."""
    from octtrain.config.sections import DataConfig
    from octtrain.data.loaders import loader_kwargs
    from octtrain.runtime.interrupt import quiet_worker_echoes

    assert loader_kwargs(DataConfig(num_workers=2))["worker_init_fn"] is quiet_worker_echoes
    script = (
        "import threading\n"
        "from octtrain.runtime.interrupt import quiet_worker_echoes\n"
        "quiet_worker_echoes(0)\n"
        "def broken(): raise ConnectionResetError(104, 'Connection reset by peer')\n"
        'def own(): raise ValueError("a thread\'s own")\n'
        "for f in (broken, own):\n"
        "    t = threading.Thread(target=f); t.start(); t.join()\n"
        "print('done')\n"
    )
    proc = run_script(script)
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr
    assert "ConnectionResetError" not in proc.stderr, proc.stderr
    assert "a thread's own" in proc.stderr


def _import_cut_by_ctrl_c() -> ImportError:
    """What CPython raises when a Ctrl-C lands while a C extension initialises."""
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as ctrl_c:
            raise ImportError("initialization failed") from ctrl_c
    except ImportError as exc:
        return exc


def test_an_import_a_ctrl_c_cut_short_is_the_interrupt(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A finetune run's first validation imports matplotlib; a Ctrl-C there came out as
    ``ImportError: initialization failed`` with a traceback and exit 1 (fresh clone, 1 run in
    many). The command ends as for any Ctrl-C: exit 130, one line, no traceback."""
    from octtrain import cli
    from octtrain.cli import commands

    def cut(args: object) -> int:
        raise _import_cut_by_ctrl_c()

    assert caused_by_ctrl_c(_import_cut_by_ctrl_c())
    assert not caused_by_ctrl_c(ImportError("no module named matplotlib"))
    monkeypatch.setattr(commands, "doctor", cut)
    assert cli.main(["doctor", "--manifest", "m.json"]) == 130
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == ["interrupted; checkpoints written before it stay"]


def test_a_ctrl_c_remembered_before_the_hosts_agree_stays_pending(python_sigint: None) -> None:
    """A Ctrl-C that came before the run's agreement began (in its setup) is not forgotten by
    entering ``agreed_ctrl_c``: the first agreement carries it to every host."""
    with remembered_ctrl_c():
        with pytest.raises(KeyboardInterrupt):
            ctrl_c()  # not agreed yet: Python's behaviour, and remembered
        with agreed_ctrl_c(2):
            assert interrupt_pending()


def test_an_error_raised_while_handling_a_ctrl_c_is_the_interrupt() -> None:
    """An exception raised inside ``except KeyboardInterrupt`` (a cleanup that fails) carries the
    Ctrl-C only as its implicit ``__context__``: still the interrupt (exit 130), not a failure."""
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("the cleanup failed")  # noqa: B904 (the point: an implicit context)
    except RuntimeError as exc:
        failed = exc
    assert failed.__cause__ is None and isinstance(failed.__context__, KeyboardInterrupt)
    assert caused_by_ctrl_c(failed)


def test_only_a_broken_connection_off_the_main_thread_is_an_echo() -> None:
    """After a Ctrl-C a worker's resource-sharer thread losing its peer is the interrupt's echo
    (logged at debug); the main thread's ConnectionError is a real error and is printed."""
    other = threading.Thread(target=lambda: None, name="sharer")
    broken = ConnectionResetError("peer gone")
    assert interrupt_module._echo(ConnectionResetError, broken, other)
    assert not interrupt_module._echo(ConnectionResetError, broken, threading.main_thread())
    assert not interrupt_module._echo(ValueError, ValueError("x"), other)
