"""Stall watchdog: reports which phase (data or compute) the loop is stuck in, once per stall.

Time is a clock the test advances; nothing depends on how fast a loaded machine runs.
"""

from __future__ import annotations

import threading

from octtrain.runtime.watchdog import StallWatchdog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_reports_the_phase_once_per_stall() -> None:
    reports: list[tuple[str, float, int]] = []
    clock = Clock()
    dog = StallWatchdog(10, lambda *r: reports.append(r), clock)  # never started: polled here
    dog.step_done(3)
    dog.set_phase("data")
    clock.now = 9.9
    dog.poll()
    assert reports == []  # not yet a stall
    clock.now = 11
    dog.poll()
    dog.poll()
    assert reports == [("data", 11, 3)]  # once per stall
    dog.step_done(4)
    dog.set_phase("compute")
    clock.now = 22
    dog.poll()
    assert reports == [("data", 11, 3), ("compute", 11, 4)]


def test_the_thread_polls_by_itself() -> None:
    seen = threading.Event()
    reports: list[str] = []

    def report(phase: str, idle: float, step: int) -> None:
        reports.append(phase)
        seen.set()

    clock = Clock()
    dog = StallWatchdog(0.2, report, clock).start()
    try:
        dog.set_phase("compute")
        clock.now = 1.0
        assert seen.wait(30)
    finally:
        dog.stop()
    assert reports == ["compute"]
