"""A Ctrl-C that no library can swallow: the loop stops at the next step boundary anyway.

Python turns SIGINT into a KeyboardInterrupt wherever the main thread happens to be. Raised
inside a ``__del__``, a garbage-collection callback or a library's broad ``except`` (a
DataLoader iterator shutting its workers down is one), it is printed as "Exception ignored" or
not at all, and training goes on: seen once in this project's tests on a loaded machine, a
pretrain that got its SIGINT just after a checkpoint and trained on for 25 minutes. The latch
keeps Python's behaviour (the KeyboardInterrupt is raised at once) and also remembers that the
signal came, so ``check`` raises it again between steps if it was lost on the way.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType


class InterruptLatch:
    """Installed around the training loop (main thread only, and only over Python's default
    SIGINT handler: a handler someone else set, or an ignored SIGINT, is left alone)."""

    def __init__(self) -> None:
        self.fired = False
        self._previous: signal.Handlers | object | None = None

    def __enter__(self) -> InterruptLatch:
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.fired = True
        raise KeyboardInterrupt

    def check(self) -> None:
        """Raise KeyboardInterrupt if SIGINT came since the latch was installed."""
        if self.fired:
            raise KeyboardInterrupt

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]
            self._previous = None
