"""Writes a reader never sees half of: files replaced whole (``atomic_write_bytes``,
``atomic_write_text``: a temporary beside the file, fsynced, renamed over it) and blocks a
Ctrl-C cannot cut (``ctrl_c_deferred``: a few renames, a loader's iterator being built).

Used by every writer of both packages (manifests, reports, checkpoints, an export's parts),
re-exported by ``octstage.manifest``; the output-folder rule (``octstage/outputs.py``) builds
its reports' swap on ``ctrl_c_deferred``. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any


@contextlib.contextmanager
def ctrl_c_deferred() -> Iterator[None]:
    """Hold a Ctrl-C back until the block ends (a few renames; a loader's iterator being built),
    then hand it to the handler it replaced (Python's raises it): the folder shows the old report
    or the new one, never half of each. Off the main thread, or with SIGINT ignored, it does
    nothing."""
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # ignored: stays so
        yield
        return
    caught: list[Any] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught and callable(previous):
        # A handler that records the Ctrl-C for later (a pod's agreed stop) keeps doing so.
        previous(signal.SIGINT, None)
    elif caught:
        raise KeyboardInterrupt


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) atomically, as ``atomic_write_bytes`` does."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the complete new one.

    Only a regular file (or a name not yet taken) is written atomically: to a temporary file
    beside it, fsynced, then renamed over it (the temporary is removed on any failure). A
    symlink is followed and its target written the same way, so the link stays a link. Anything
    else (a FIFO, ``/dev/stdout``, ``/dev/null``, a terminal) is written in place: renaming over
    it would replace the pipe or device with a new regular file that nobody reads. A directory
    is refused. Any OSError names the path it concerns.
    """
    target = Path(os.path.realpath(path))  # every link in the chain followed
    try:
        mode: int | None = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise _named(exc, path) from None
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a file to write", str(path))
    if mode is not None and not stat.S_ISREG(mode):
        try:
            with open(target, "wb") as fh:  # a FIFO blocks here until a reader opens it
                fh.write(data)
        except OSError as exc:
            raise _named(exc, path) from None
        return
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise _named(exc, path) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _named(exc, path) from None
        raise


def _named(exc: OSError, path: Path) -> OSError:
    """The same error, naming ``path`` (a failed ``write`` or ``fsync`` names no file)."""
    if exc.errno is None:  # raised by hand, with its own message
        return exc
    return OSError(exc.errno, exc.strerror, str(path))
