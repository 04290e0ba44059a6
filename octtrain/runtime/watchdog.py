"""Stall watchdog: say what the loop is waiting for when no step finishes in time.

The loop marks its phase (``"data"`` while blocked on the loader, ``"compute"`` while a step
runs) and each finished step; a daemon thread reports once per stall, through a callback, which
phase has lasted how long. It never stops the run: a slow first XLA compile is not an error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class StallWatchdog:
    def __init__(self, timeout_s: float, report: Callable[[str, float, int], None]) -> None:
        """``report(phase, seconds_since_last_step, last_step)`` is called from the thread."""
        self.timeout_s = timeout_s
        self.report = report
        self.phase = "startup"
        self.step = 0
        self._last = time.monotonic()
        self._reported = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-watchdog", daemon=True)

    def start(self) -> StallWatchdog:
        self._last = time.monotonic()
        self._thread.start()
        return self

    def set_phase(self, phase: str) -> None:
        self.phase = phase

    def step_done(self, step: int) -> None:
        self.step = step
        self._last = time.monotonic()
        self._reported = False

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        interval = min(5.0, self.timeout_s / 4)
        while not self._stop.wait(interval):
            idle = time.monotonic() - self._last
            if idle >= self.timeout_s and not self._reported:
                self._reported = True
                self.report(self.phase, idle, self.step)
