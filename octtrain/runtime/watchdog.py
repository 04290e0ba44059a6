"""Stall watchdog: say what the loop is waiting for when no step finishes in time.

The loop marks its phase (``"data"`` while blocked on the loader, ``"compute"`` while a step
runs) and each finished step; a daemon thread polls and reports once per stall, through a
callback, which phase has lasted how long. It never stops the run: a slow first XLA compile is
not an error. The clock is injectable and ``poll`` public, so tests decide when time passes
instead of sleeping (a loaded machine never makes them pass or fail).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class StallWatchdog:
    def __init__(
        self,
        timeout_s: float,
        report: Callable[[str, float, int], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``report(phase, seconds_since_last_step, last_step)`` is called from the thread."""
        self.timeout_s = timeout_s
        self.report = report
        self.clock = clock
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

    def step_done(self, step: int) -> None:
        with self._lock:
            self.step = step
            self._last = self.clock()
            self._reported = False

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def poll(self) -> None:
        """Report the current phase if no step finished for ``timeout_s`` (once per stall)."""
        with self._lock:
            idle = self.clock() - self._last
            if idle < self.timeout_s or self._reported:
                return
            self._reported = True
            phase, step = self.phase, self.step
        self.report(phase, idle, step)

    def _run(self) -> None:
        interval = min(5.0, self.timeout_s / 4)
        while not self._stop.wait(interval):
            self.poll()
