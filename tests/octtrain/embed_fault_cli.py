"""Run by ``test_embed_processes.py`` as one process of a multi-process export, the environment
set as torchrun or a scheduler sets it on each host (RANK, WORLD_SIZE, MASTER_ADDR/PORT): the
``octtrain`` CLI, ``{rank}`` in an argument replaced by this process's rank, with one fault put
on the rank the environment names (the code under test is unchanged):

* ``EMBED_SLOW_RANK`` / ``EMBED_SLOW_S``: that rank sleeps before each part it starts.
* ``EMBED_FAIL_RANK``: that rank's read of its first field raises the DataError of a field
  that cannot be read.
* ``EMBED_BUG_RANK``: that rank's read of its first field raises a RuntimeError (a loader
  worker killed by a bus error: not an octtrain error).
* ``EMBED_KILL_RANK`` / ``EMBED_KILL_PART``: that rank SIGKILLs itself as it starts its part N.
* ``EMBED_FINISH_RANK`` / ``EMBED_FINISH_S``: on that rank (process 0: it writes the group
  table) the table's writing takes that long, then fails with a storage client's error.
* ``EMBED_TIMEOUT_S``: the collectives' timeout (the backend's 10 minutes, shortened so that a
  wait longer than it shows in seconds).
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time
from typing import Any

from octtrain.cli import main
from octtrain.embed import items, run
from octtrain.errors import DataError
from octtrain.runtime import torch_backend

RANK = os.environ.get("RANK", "0")


def _on(name: str) -> bool:
    return os.environ.get(name) == RANK


def install() -> None:
    if "EMBED_TIMEOUT_S" in os.environ:
        seconds = float(os.environ["EMBED_TIMEOUT_S"])
        torch_backend.COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=seconds)
    started = {"parts": 0}
    next_part = run.PartSink._next

    def _next(self: run.PartSink, dim: int) -> None:
        if _on("EMBED_SLOW_RANK"):
            time.sleep(float(os.environ["EMBED_SLOW_S"]))
        if _on("EMBED_KILL_RANK") and started["parts"] == int(os.environ["EMBED_KILL_PART"]):
            os.kill(os.getpid(), signal.SIGKILL)
        started["parts"] += 1
        next_part(self, dim)

    run.PartSink._next = _next  # type: ignore[method-assign]
    read = items.PartsItems.__getitem__

    def getitem(self: items.PartsItems, index: int) -> dict[str, Any]:
        if _on("EMBED_FAIL_RANK") and index == 0:
            raise DataError(f"field {index} of rank {RANK}: cannot read its pack (injected)")
        if _on("EMBED_BUG_RANK") and index == 0:
            raise RuntimeError(f"DataLoader worker of rank {RANK} is killed by signal: Bus error")
        return read(self, index)

    items.PartsItems.__getitem__ = getitem  # type: ignore[method-assign]
    if _on("EMBED_FINISH_RANK"):

        def finish(*args: Any) -> Any:
            time.sleep(float(os.environ["EMBED_FINISH_S"]))
            raise ConnectionResetError("gs://bucket/export/wells.parquet: connection reset")

        run.finish = finish  # type: ignore[assignment]


if __name__ == "__main__":
    install()
    sys.exit(main([a.replace("{rank}", RANK) for a in sys.argv[1:]]))
