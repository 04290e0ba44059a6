"""A Ctrl-C that Python drops: raised inside a ``__del__`` (standard library only, so a test's
fresh interpreter imports it at no cost)."""

from __future__ import annotations

import gc
import os
import signal
import time


class CtrlCInDel:
    """Ctrl-C arrives while this object's ``__del__`` runs: Python raises KeyboardInterrupt
    there, prints "Exception ignored in" and drops it (as in a DataLoader iterator's
    ``__del__``, or the logging module's at-fork hook, where finetune lost it)."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the handler runs between these bytecodes
            pass


def drop_a_ctrl_c() -> None:
    obj = CtrlCInDel()
    del obj
    gc.collect()
