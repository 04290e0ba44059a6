"""Fixtures for the bad-input tests: a tiny clean dataset and a CLI runner that captures output."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from octstage.dataset.synth import SynthInfo, generate
from tests.badinput import slow_open as slow


@dataclass(frozen=True)
class Ran:
    """One in-process CLI run: its exit code and what it printed."""

    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        """stdout and stderr together, with rich's line wrapping undone."""
        return " ".join((self.out + "\n" + self.err).split())


@pytest.fixture(scope="session")
def tiny_source(tmp_path_factory: pytest.TempPathFactory) -> SynthInfo:
    """4 labelled participants, 8 clean volumes (plus 2 unlabelled participants' files)."""
    return generate(tmp_path_factory.mktemp("badinput") / "src", participants=4, traps=False)


@pytest.fixture
def source(tiny_source: SynthInfo, tmp_path: Path) -> Path:
    """A private copy of the tiny dataset, for a test to damage."""
    return Path(shutil.copytree(tiny_source.root, tmp_path / "src"))


@pytest.fixture
def octstage_cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Ran]:
    """Run ``octstage ARGS`` in this process; long lines are not wrapped (COLUMNS)."""
    from octstage.cli import main

    monkeypatch.setenv("COLUMNS", "1000")

    def run(*args: str | Path) -> Ran:
        capsys.readouterr()
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return Ran(code, captured.out, captured.err)

    return run


def assert_clean(ran: Ran, code: int, *names: str | Path) -> None:
    """The exit code, no traceback, and every name in the message."""
    assert ran.code == code, ran.text
    assert "Traceback" not in ran.out + ran.err
    for name in names:
        assert str(name) in ran.text, (name, ran.text)


def tiny_build(source: str | Path, labels: str | Path, out: str | Path) -> tuple[str | Path, ...]:
    """``build-cache`` of the tiny dataset at the tests' size (8x32x32, one worker): the
    arguments before a case's own."""
    return (
        "build-cache",
        "--source",
        source,
        "--labels",
        labels,
        "--out",
        out,
        "--shape",
        "8",
        "32",
        "32",
        "--workers",
        "1",
    )


def sigint_as_at_a_terminal() -> None:
    """``preexec_fn`` of a process the test will Ctrl-C: SIGINT at its default, as for a command
    in the foreground of a terminal. A child inherits an ignored SIGINT (a test run started in
    the background of a script, ``cmd &``, has it ignored) and Python keeps it ignored, so the
    interrupt would never arrive and the run would go on."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_as_at_a_terminal(
    module: str, args: list[str], root: Path, slow_open: tuple[Path, Path] | None = None
) -> subprocess.Popen[bytes]:
    """``MODULE.main(ARGS)`` run as its console script runs it (``octtrain ARGS``), in a process
    group of its own (a Ctrl-C test signals the whole group), SIGINT at its default, output
    merged into one pipe, wandb off.

    Not ``python -m MODULE``: under ``-m`` CPython exits by SIGINT (code -2) whenever a
    KeyboardInterrupt once left code run from a string (``exec``: a dataclass being built, say),
    even one the command then caught and turned into its exit code 130 (``Py_RunMain`` checks
    ``unhandled_keyboard_interrupt`` after ``pymain_run_module``). The console script, like
    ``-c``, exits with the command's code.

    ``slow_open`` (a file, a named pipe): the file's first open waits on the pipe
    (``tests/badinput/slow_open.py``)."""
    env = {**os.environ, "PYTHONPATH": str(root), "WANDB_MODE": "disabled", "COLUMNS": "1000"}
    script = f"import sys; from {module} import main; sys.exit(main())"
    if slow_open is not None:
        target, gate = slow_open
        env |= {slow.TARGET: str(target.absolute()), slow.GATE: str(gate)}
        script = f"from tests.badinput.slow_open import install; install(); {script}"
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=root,
        preexec_fn=sigint_as_at_a_terminal,
        start_new_session=True,
    )
