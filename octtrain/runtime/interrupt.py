"""A Ctrl-C that cannot be lost: raised where it arrives, and again at the next check if Python
dropped it there.

On a pod a Ctrl-C must not end one host alone: the others would wait for it in their next
collective (gloo's peer-closed error, or a hang that only the watchdog ends). Within
``agreed_ctrl_c`` (the trainer's run, with more than one host) a first Ctrl-C therefore raises
nothing: it only sets the flag ``interrupt_pending`` reads, which ``hosts.agree`` carries to
every host at its next agreement (each step, each validation batch, each checkpoint write), and
every host then raises KeyboardInterrupt at that same point (exit 130 together). A second
Ctrl-C on the same host raises at once, as before (the operator's way out of a host stuck in a
collective; the others then end through the watchdog).

Python raises KeyboardInterrupt in whatever code the main thread runs when SIGINT arrives. Where
that code's exceptions are dropped (a ``__del__``, a weakref finalizer, an ``os.register_at_fork``
hook: "Exception ignored in ...") the interrupt is gone, and the command goes on as if nothing
happened. The trainer runs such code often right as it starts: DataLoader iterators shut their
workers down from ``__del__`` (joins of up to seconds), and forking workers runs the at-fork hooks
of the libraries loaded (wandb's telemetry). A Ctrl-C as ``finetune`` printed its split sizes
was dropped this way now and then, and the run went on (for ``train.epochs`` epochs) instead of
ending. ``remembered_ctrl_c`` installs a handler that raises as Python's does and also records
the interrupt; ``check_interrupted`` (called once per training step, per batch awaited, per
validation batch) raises it again. Nothing is swallowed twice: the record stays set until the
block ends, so every later check raises too.

A terminal sends Ctrl-C to the DataLoader workers too, and a worker that dies while it fetches
a file descriptor from this process breaks the connection of multiprocessing's resource-sharer
thread, which prints the ConnectionResetError's traceback through ``sys.excepthook`` after the
command said "interrupted" (CI, Python 3.12, 1 run in many). Once a Ctrl-C arrived, such
connection errors from other threads (reported through ``sys.excepthook`` as the sharer does, or
``threading.excepthook`` as any other thread does) are the interrupt's echo: they go to the
debug log.

The KeyboardInterrupt Python drops is reported too, through ``sys.unraisablehook``: "Exception
ignored in: <function _get_module_lock.<locals>.cb ...>" and its traceback, printed above
"interrupted" (CI, Python 3.12: a Ctrl-C landed in the import lock's weakref callback as a
validation imported a module). That interrupt is not lost (it is remembered and raised again
at the next check), so its report is not an error either: once a Ctrl-C arrived, a dropped
KeyboardInterrupt goes to the debug log; any other dropped exception is printed as before.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType, TracebackType

log = logging.getLogger(__name__)

_PENDING = threading.Event()
_AGREED = threading.Event()  # within agreed_ctrl_c: a first Ctrl-C waits for the hosts' agreement
_ECHOES = (ConnectionError, EOFError)  # a peer process ended by the same Ctrl-C


def _echo(exc_type: type[BaseException], exc: object, thread: threading.Thread | None) -> bool:
    """Whether a thread's error is the interrupt's echo (then logged at debug): a broken
    connection off the main thread."""
    if not issubclass(exc_type, _ECHOES) or thread is threading.main_thread():
        return False
    log.debug("after Ctrl-C, thread %s: %s", thread.name if thread else "?", exc)
    return True


def _quiet_echoes(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> None:
    """``sys.excepthook`` after a Ctrl-C (the resource sharer reports through it): an echo is
    logged; anything else goes to the hook it replaced."""
    if not _echo(exc_type, exc, threading.current_thread()):
        _PREVIOUS_HOOK(exc_type, exc, tb)


def _quiet_thread_echoes(args: threading.ExceptHookArgs) -> None:
    """``threading.excepthook`` after a Ctrl-C (a ``Thread``'s uncaught error): the same."""
    if not _echo(args.exc_type, args.exc_value, args.thread):
        _PREVIOUS_THREAD_HOOK(args)


def _quiet_dropped_ctrl_c(unraisable: sys.UnraisableHookArgs) -> None:
    """``sys.unraisablehook`` after a Ctrl-C: the KeyboardInterrupt Python dropped (in a
    ``__del__``, a weakref callback, an at-fork hook) is remembered, so it is logged at debug;
    any other dropped exception goes to the hook this replaced."""
    if issubclass(unraisable.exc_type, KeyboardInterrupt) and _PENDING.is_set():
        log.debug("a Ctrl-C landed where Python drops exceptions (%r)", unraisable.object)
        return
    _PREVIOUS_UNRAISABLE_HOOK(unraisable)


_PREVIOUS_HOOK = sys.excepthook
_PREVIOUS_THREAD_HOOK = threading.excepthook
_PREVIOUS_UNRAISABLE_HOOK = sys.unraisablehook


def _install_quiet_hooks() -> None:
    global _PREVIOUS_HOOK, _PREVIOUS_THREAD_HOOK, _PREVIOUS_UNRAISABLE_HOOK
    if sys.excepthook is not _quiet_echoes:
        _PREVIOUS_HOOK, sys.excepthook = sys.excepthook, _quiet_echoes
    if threading.excepthook is not _quiet_thread_echoes:
        _PREVIOUS_THREAD_HOOK, threading.excepthook = threading.excepthook, _quiet_thread_echoes
    if sys.unraisablehook is not _quiet_dropped_ctrl_c:
        _PREVIOUS_UNRAISABLE_HOOK, sys.unraisablehook = sys.unraisablehook, _quiet_dropped_ctrl_c


def _interrupt(signum: int, frame: FrameType | None) -> None:
    first = not _PENDING.is_set()
    _PENDING.set()
    # Never undone: the echoes come while the command ends, after the block has closed.
    _install_quiet_hooks()
    if first and _AGREED.is_set():
        log.warning(
            "Ctrl-C: every host stops at its next agreement (the next step, validation batch "
            "or checkpoint); Ctrl-C again stops this host alone, now"
        )
        return
    raise KeyboardInterrupt


def quiet_worker_echoes(worker_id: int) -> None:
    """A DataLoader worker's ``worker_init_fn``: the echoes quiet from its start. A worker's
    resource-sharer thread serves file descriptors to the main process; when a Ctrl-C ends the
    main process first, that thread's connection breaks while the worker's own SIGINT handler
    has not run yet (its main thread waits in C code), and its traceback reached the terminal
    after "interrupted" (CI, Python 3.11, 1 run in many). In a worker such a broken connection
    off its main thread only ever means the main process went away."""
    _install_quiet_hooks()


@contextlib.contextmanager
def remembered_ctrl_c() -> Iterator[None]:
    """Within the block, a Ctrl-C raises KeyboardInterrupt and is remembered for
    ``check_interrupted``. Off the main thread, or with SIGINT not at Python's own handler
    (ignored, or a handler of the caller's), it changes nothing."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    _PENDING.clear()
    previous = signal.signal(signal.SIGINT, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _PENDING.clear()


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as a Ctrl-C is (``terminated_as_interrupt``): what torchrun sends the
    other processes of a failed one, and what Slurm and Kubernetes send before they kill."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    _install_quiet_hooks()  # the loader workers end with it: their broken pipes are its echo
    raise Terminated


@contextlib.contextmanager
def terminated_as_interrupt() -> Iterator[None]:
    """Within the block SIGTERM raises ``Terminated``, so it unwinds as a Ctrl-C does (the part
    or the write in progress dropped, what was finished kept) instead of ending the process
    where it stands with nothing said. Off the main thread, or with SIGTERM not at its
    default (ignored, or a handler of the caller's), it changes nothing."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def terminated(exc: BaseException) -> bool:
    """Whether ``exc`` is (or was caused by) a SIGTERM rather than a Ctrl-C."""
    return any(isinstance(cause, Terminated) for cause in _causes(exc))


def check_interrupted() -> None:
    """On the main thread, raise KeyboardInterrupt if a Ctrl-C arrived in the block (even one
    Python dropped); elsewhere nothing (a thread's KeyboardInterrupt would end only it), and
    nothing within ``agreed_ctrl_c`` either (the hosts' next agreement raises it on all)."""
    if (
        _PENDING.is_set()
        and not _AGREED.is_set()
        and threading.current_thread() is threading.main_thread()
    ):
        raise KeyboardInterrupt


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and its causes, explicit or implicit (an error raised while handling another)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        yield cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__


def caused_by_ctrl_c(exc: BaseException) -> bool:
    """Whether a Ctrl-C is among the causes of ``exc``: a KeyboardInterrupt raised while a C
    extension initialises comes out as ``ImportError: initialization failed`` raised from it
    (matplotlib's, imported at the first validation: a finetune run printed a traceback and
    exit 1 for a Ctrl-C, 1 run in many). Such an exception is the interrupt, not a failure."""
    return any(isinstance(cause, KeyboardInterrupt) for cause in _causes(exc))


def interrupt_pending() -> bool:
    """Whether a Ctrl-C arrived in the block (what ``hosts.agree`` sends to the other hosts)."""
    return _PENDING.is_set()


@contextlib.contextmanager
def agreed_ctrl_c(hosts: int) -> Iterator[None]:
    """With more than one host, on the main thread, with SIGINT at Python's handler or
    ``remembered_ctrl_c``'s: within the block a first Ctrl-C only sets the flag the hosts agree
    on (module docstring). Otherwise it changes nothing. A Ctrl-C that no agreement carried
    (it came after the last one: the run had finished on every host) is forgotten at the end."""
    handler = signal.getsignal(signal.SIGINT)
    if (
        hosts == 1
        or _AGREED.is_set()
        or threading.current_thread() is not threading.main_thread()
        or handler not in (signal.default_int_handler, _interrupt)
    ):
        yield
        return
    fresh = handler is signal.default_int_handler  # not within remembered_ctrl_c: ours alone
    if fresh:
        _PENDING.clear()
    previous = signal.signal(signal.SIGINT, _interrupt)
    _AGREED.set()
    try:
        yield
    finally:
        _AGREED.clear()
        signal.signal(signal.SIGINT, previous)
    if _PENDING.is_set():
        log.warning("a Ctrl-C came after the hosts' last agreement: the run had finished")
        _PENDING.clear()
