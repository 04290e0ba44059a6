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
    dog = StallWatchdog(10, lambda *r: reports.append(r), clock=clock)  # never started: polled here
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
    dog = StallWatchdog(0.2, report, clock=clock).start()
    try:
        dog.set_phase("compute")
        clock.now = 1.0
        assert seen.wait(30)
    finally:
        dog.stop()
    assert reports == ["compute"]


def test_the_first_two_steps_get_their_allowance_then_only_the_timeout() -> None:
    dog = StallWatchdog(10.0, lambda *a: None, first_step_allowance_s=600.0)
    assert dog.allowance() == 600.0  # the first compile of a TPU step is not a stall
    dog.step_done(1)
    dog.step_done(1)  # again at the end of its unit: still one step
    assert dog.allowance() == 600.0  # step 2 compiles the program with the optimizer's state
    dog.step_done(2)
    assert dog.allowance() == 0.0


def test_exit_after_ends_a_stuck_process_through_its_callback() -> None:
    ended: list[tuple[str, int]] = []
    seen = threading.Event()

    def on_exit(phase: str, idle: float, step: int) -> None:
        ended.append((phase, step))
        seen.set()

    now = [0.0]
    dog = StallWatchdog(
        10.0, lambda *a: None, exit_after_s=30.0, on_exit=on_exit, clock=lambda: now[0]
    )
    dog.step_done(7)
    dog.set_phase("checkpoint")
    now[0] = 29.0
    assert dog.poll() is False and ended == []
    now[0] = 31.0
    assert dog.poll() is True
    assert ended == [("checkpoint", 7)] and seen.is_set()


def test_no_stall_is_reported_or_exited_within_the_first_step_allowance() -> None:
    clock = Clock()
    reports: list[tuple[str, float, int]] = []
    exits: list[tuple[str, float, int]] = []
    dog = StallWatchdog(
        10.0,
        lambda *r: reports.append(r),
        first_step_allowance_s=600.0,
        exit_after_s=30.0,
        on_exit=lambda *r: exits.append(r),
        clock=clock,
    )  # never started: polled here
    clock.now = 300.0  # a slow first compile: neither a stall nor an exit
    assert dog.poll() is False and reports == [] and exits == []
    clock.now = 611.0
    dog.poll()
    assert len(reports) == 1 and exits == []
    dog.step_done(1)
    clock.now = 622.0  # step 2 compiles its own program (the optimizer's state): still allowed
    dog.poll()
    assert len(reports) == 1
    dog.step_done(2)
    clock.now = 633.0  # after the first two steps, the timeout alone
    dog.poll()
    assert len(reports) == 2
