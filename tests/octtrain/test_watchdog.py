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


def test_the_first_step_gets_its_allowance_then_only_the_timeout() -> None:
    dog = StallWatchdog(10.0, lambda *a: None, first_step_allowance_s=600.0)
    assert dog.allowance() == 600.0  # the first compile of a TPU step is not a stall
    dog.step_done(1)
    assert dog.allowance() == 0.0


def test_exit_after_ends_a_stuck_process_through_its_callback() -> None:
    ended: list[tuple[str, int]] = []
    seen = threading.Event()

    def on_exit(phase: str, idle: float, step: int) -> None:
        ended.append((phase, step))
        seen.set()

    dog = StallWatchdog(0.1, lambda *a: None, exit_after_s=0.3, on_exit=on_exit).start()
    try:
        dog.step_done(7)
        dog.set_phase("checkpoint")
        assert seen.wait(30)
    finally:
        dog.stop()
    assert ended == [("checkpoint", 7)]
