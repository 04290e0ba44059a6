"""A slow disk, for the Ctrl-C tests, made certain: in the command's own interpreter the first
open of one file waits on a named pipe the test holds, as a read from a slow disk or bucket waits.

Not a named pipe in the command's input: every reader refuses a FIFO (opening one would block it
for good), so the wait sits in front of a regular file instead. Python's ``open`` audit event
(PEP 578) comes before ``open()`` and ``os.open`` open anything, in whichever thread reads."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

TARGET = "OCT_TEST_SLOW_OPEN"  # the file whose first open waits
GATE = "OCT_TEST_SLOW_GATE"  # the named pipe it waits on, outside every folder the command reads


def install() -> None:
    """Add the hook when the environment names a file and a gate; nothing otherwise."""
    target, gate = os.environ.get(TARGET), os.environ.get(GATE)
    if not target or not gate:
        return
    once = threading.Lock()

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event != "open" or not isinstance(args[0], str | bytes | os.PathLike):
            return
        if os.path.abspath(os.fsdecode(args[0])) != target or not once.acquire(blocking=False):
            return
        fd = os.open(gate, os.O_RDONLY)  # until the test opens its end: the moment is known
        try:
            os.read(fd, 1)  # until the test closes it: the slow read ends
        finally:
            os.close(fd)

    sys.addaudithook(hook)
