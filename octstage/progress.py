"""Progress for logs: when stderr is not a terminal, rich's bars print nothing at all, so a
long run (a cron job, a CI step, ``nohup``) prints one plain line every few seconds instead.

The interval comes from ``--progress-seconds``, else ``$OCTSTAGE_PROGRESS_SECONDS``, else 30 s;
0 prints a line at every update.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from octstage.errors import ConfigError

ENV = "OCTSTAGE_PROGRESS_SECONDS"
DEFAULT_SECONDS = 30.0


def interval(explicit: float | None = None) -> float:
    """Seconds between plain progress lines (see the module doc); ConfigError if invalid."""
    if explicit is not None:
        value, where = explicit, "--progress-seconds"
    else:
        raw = os.environ.get(ENV)
        if raw is None or not raw.strip():
            return DEFAULT_SECONDS
        where = f"${ENV}"
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"{where}={raw!r}: not a number of seconds") from None
    if not value >= 0:  # also refuses NaN
        raise ConfigError(f"{where}: seconds between progress lines must be >= 0, got {value}")
    return value


class LineProgress:
    """Prints ``label: done/total (pct), detail, elapsed`` at most once per ``seconds``."""

    def __init__(
        self,
        console: Console,
        label: str,
        seconds: float,
        fmt: Callable[[float], str] = lambda n: str(int(n)),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console, self.label, self.seconds, self.fmt, self.clock = (
            console,
            label,
            seconds,
            fmt,
            clock,
        )
        self.started = self.last = clock()

    def update(
        self, done: float, total: float | None, detail: str = "", final: bool = False
    ) -> None:
        now = self.clock()
        if not final and now - self.last < self.seconds:
            return
        self.last = now
        text = f"{self.label}: {self.fmt(done)}"
        if total:
            text += f"/{self.fmt(total)} ({done / total:.0%})"
        if detail:
            text += f", {detail}"
        text += f", {now - self.started:.0f} s"
        # Plain text: a file name or figure must not be read as rich markup.
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)


class Advance(Protocol):
    """A counter's step: ``detail`` shown beside the count, ``count`` items finished."""

    def __call__(self, detail: str = "", count: int = 1) -> None: ...


@contextmanager
def counter(console: Console, label: str, total: int, seconds: float) -> Iterator[Advance]:
    """Yields ``advance(detail, count=1)``, called per finished item (or ``count`` of them) from
    any thread: a rich bar on a terminal, else a plain line at most every ``seconds`` and always
    at the last item."""
    if console.is_terminal:
        with Progress(
            TextColumn(label),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.description}"),
            console=console,
            transient=True,
        ) as bar:
            job = bar.add_task("", total=total)

            def step(detail: str = "", count: int = 1) -> None:
                bar.update(job, advance=count, description=detail)

            yield step
        return
    lines = LineProgress(console, label, seconds)
    lock = threading.Lock()  # items finish on pool threads: one count, lines in order
    done = 0

    def line(detail: str = "", count: int = 1) -> None:
        nonlocal done
        with lock:
            done += count
            lines.update(done, total, detail, final=done == total)

    yield line


def megabytes(n: float) -> str:
    return f"{n / 1e6:.1f} MB"
