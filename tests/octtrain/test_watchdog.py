"""Stall watchdog: reports which phase (data or compute) the loop is stuck in, once per stall."""

from __future__ import annotations

import threading

from octtrain.runtime.watchdog import StallWatchdog


def test_reports_the_phase_once_per_stall() -> None:
    reports: list[tuple[str, int]] = []
    seen = threading.Event()

    def report(phase: str, idle: float, step: int) -> None:
        reports.append((phase, step))
        seen.set()

    dog = StallWatchdog(0.2, report).start()
    try:
        dog.step_done(3)
        dog.set_phase("data")
        assert seen.wait(30)
        seen.clear()
        dog.step_done(4)
        dog.set_phase("compute")
        assert seen.wait(30)
    finally:
        dog.stop()
    assert reports[:2] == [("data", 3), ("compute", 4)]
