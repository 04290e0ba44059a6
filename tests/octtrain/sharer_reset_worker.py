"""Run by test_interrupt.py: multiprocessing's resource-sharer thread meets a peer that dies
mid-handshake, as a DataLoader worker ended by the same Ctrl-C does.

``python sharer_reset_worker.py plain|interrupted``: ``interrupted`` first takes a Ctrl-C inside
``remembered_ctrl_c`` (as the CLI does). Then a client connects to the sharer's socket and
closes it with the sharer's challenge unread, so the sharer's read gets ECONNRESET and the
sharer thread reports it through ``sys.excepthook``; then a plain thread dies of a
ConnectionResetError, reported through ``threading.excepthook``. Prints ``done`` at the end.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from multiprocessing import resource_sharer

from octtrain.runtime.interrupt import remembered_ctrl_c


def main(mode: str) -> None:
    # A terminal's process has Python's own Ctrl-C handler; one started from a background job of
    # a non-interactive shell inherits SIGINT ignored, and remembered_ctrl_c then (rightly)
    # changes nothing: the test models the terminal.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if mode == "interrupted":
        with remembered_ctrl_c():
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
            except KeyboardInterrupt:
                pass
    read_end, _ = os.pipe()
    shared = resource_sharer.DupFd(read_end)  # starts the sharer's listener thread
    address = resource_sharer._resource_sharer._address  # type: ignore[attr-defined]
    client = socket.socket(socket.AF_UNIX)
    client.connect(address)
    time.sleep(0.3)  # the challenge arrives and stays unread
    client.close()  # unread data at close: the sharer's recv gets ECONNRESET
    time.sleep(0.5)
    del shared
    # Any other thread's broken connection reaches threading.excepthook instead.
    thread = threading.Thread(target=_reset, name="peer-reader")
    thread.start()
    thread.join()
    print("done")


def _reset() -> None:
    raise ConnectionResetError(104, "Connection reset by peer (a thread's own)")


if __name__ == "__main__":
    main(sys.argv[1])
