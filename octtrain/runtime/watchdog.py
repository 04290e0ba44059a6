"""Stall watchdog: say what the loop is waiting for when no step finishes in time.

The loop marks its phase (``"data"`` while blocked on the loader, ``"compute"`` while a step
runs) and each finished step; a daemon thread polls and reports once per stall, through a
callback, which phase has lasted how long. Until the first step finished, every limit is longer
by ``first_step_allowance_s``: a slow first XLA compile is not a stall. With ``exit_after_s`` it
is also the backstop of ``hosts.agree``: a host stuck that long in a collective (its peer died
without a word) calls ``on_exit``, which ends the process (``STALL_EXIT_CODE``), so no host of a
pod waits forever. The clock is injectable and ``poll`` public, so tests decide when time passes
instead of sleeping (a loaded machine never makes them pass or fail).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from octtrain import exitcodes

STALL_EXIT_CODE = exitcodes.STALLED.code  # the CLI's exit code for a run ended by the watchdog

ALLOWED_STEPS = 2  # steps that compile their own program before the step's graph is steady
Report = Callable[[str, float, int], None]


class StallWatchdog:
    def __init__(
        self,
        timeout_s: float,
        report: Report,
        first_step_allowance_s: float = 0.0,
        exit_after_s: float = 0.0,
        on_exit: Report | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``report(phase, seconds_since_last_step, last_step)`` is called from the thread;
        ``on_exit`` (same arguments) after ``exit_after_s`` without a step (0: never)."""
        self.timeout_s = timeout_s
        self.report = report
        self.first_step_allowance_s = first_step_allowance_s
        self.exit_after_s = exit_after_s
        self.on_exit = on_exit
        self.clock = clock
        self._done: set[int] = set()  # the first steps finished (up to ALLOWED_STEPS)
        self.phase = "startup"
        self.step = 0
        self._last = clock()
        self._reported = False
        self._lock = threading.Lock()  # the thread and a direct poll report a stall once
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-watchdog", daemon=True)

    def start(self) -> StallWatchdog:
        self._last = self.clock()
        self._thread.start()
        return self

    def set_phase(self, phase: str) -> None:
        self.phase = phase

    def allowance(self) -> float:
        """Seconds added to every limit now: the first-step allowance until ``ALLOWED_STEPS``
        steps finished (on XLA the second step compiles a program of its own: the one that
        carries the optimizer's state, which the first step created)."""
        return 0.0 if len(self._done) >= ALLOWED_STEPS else self.first_step_allowance_s

    def step_done(self, step: int) -> None:
        with self._lock:
            if len(self._done) < ALLOWED_STEPS:
                self._done.add(step)
            self.step = step
            self._last = self.clock()
            self._reported = False

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)  # a daemon: one wait of its poll at most, never more

    def poll(self) -> bool:
        """Report the current phase if no step finished for ``timeout_s`` (once per stall);
        past ``exit_after_s`` call ``on_exit`` and return True (the thread then ends)."""
        with self._lock:
            idle = self.clock() - self._last
            extra = self.allowance()
            phase, step = self.phase, self.step
            stalled = idle >= self.timeout_s + extra and not self._reported
            if stalled:
                self._reported = True
        if stalled:
            self.report(phase, idle, step)
        if self.on_exit and self.exit_after_s and idle >= self.exit_after_s + extra:
            self.on_exit(phase, idle, step)
            return True
        return False

    def _run(self) -> None:
        interval = min(5.0, self.timeout_s / 4)
        while not self._stop.wait(interval):
            if self.poll():
                return
