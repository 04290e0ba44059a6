"""Run by torchrun in test_pod.py's failure tests: ``octtrain pretrain`` through the CLI on one
simulated host, with one failure injected on one host.

``POD_FAIL=<point>:<rank>`` picks it: ``data`` (that host's training loader raises a
``DataError`` from its ninth volume on, its third batch, as a bad volume in its local cache
would), ``validation`` (its validation loader raises from its ninth volume on), ``checkpoint``
(its checkpoint write raises a ``CheckpointError``, as a full disk or a refused bucket would),
``checkpoint-any`` (its write raises a ``PermissionError``, as a storage client's HTTP 401 would),
``setup`` (its manifest cannot be read: a ``DataError`` before the first step),
``finetune-setup`` (the same in ``octtrain finetune``; ``POD_JOB=finetune`` runs that command),
``hang`` (its ninth training volume never arrives, as a read from a dead mount),
``resume-list`` and ``resume-read`` (finding the checkpoint to resume from, or reading it,
raises a ``PermissionError`` as a storage client's HTTP 401 would: give ``checkpoint.resume``),
``slow-setup`` (its manifest read, V-JEPA's or DINO's, touches the file ``POD_MARK``, then
takes 3 s: a test's moment to Ctrl-C while the job is set up), ``slow-save`` (the same in its
checkpoint write: a Ctrl-C mid-save), ``dino-validation`` (DINO's validation cannot read that host's
first validation field: run with a DINO config), ``dino-forward`` (its validation forward runs
out of memory; ``dino-forward-last``: in its last batch, of two), ``dino-metrics`` (its
validation metrics fail, after the last batch), ``setup-any`` (setting up the run folder
raises a storage client's error, not an octtrain one: give rank 0).
``{rank}`` in an argument becomes this process's rank. Writes ``<out>/rank<r>.json`` with the
CLI's exit code, the first line of each error it logged, when the first was and when it ended,
then exits with that code (after a pause, so torchrun, which stops the other workers once one
has failed, cannot cut the other host short of its own verdict).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from octtrain.cli import main
from octtrain.data.dataset import ManifestDataset
from octtrain.errors import CheckpointError, DataError
from octtrain.eval.cellpainting import profile_run
from octtrain.runtime import checkpoint
from octtrain.runtime.checkpoint import CheckpointManager
from octtrain.train import dino, finetune, loop, pretrain


def _slow(read_now: Any) -> Any:
    """``read_now`` that first touches ``POD_MARK``, then takes 3 s."""

    def slow_read(*args: Any, **kwargs: Any) -> Any:
        Path(os.environ["POD_MARK"]).touch()
        time.sleep(3)
        return read_now(*args, **kwargs)

    return slow_read


def inject(point: str, rank: int) -> None:
    if point == "setup":

        def unreadable(path: Any, *kinds: Any) -> Any:
            raise DataError(f"{path}: truncated JSON in host {rank}'s copy of the manifest")

        pretrain.read_manifest = unreadable  # type: ignore[assignment]
        return
    if point == "finetune-setup":

        def unreadable_here(path: Any, *kinds: Any) -> Any:
            raise DataError(f"{path}: truncated JSON in host {rank}'s copy of the manifest")

        finetune.read_manifest = unreadable_here  # type: ignore[assignment]
        return
    if point == "dino-validation":

        def unreadable_field(field: Any, tile: int) -> Any:
            raise DataError(f"field 0: unreadable chunk in host {rank}'s copy of the plate")

        profile_run.field_views = unreadable_field  # type: ignore[assignment]
        return
    if point in ("dino-forward", "dino-forward-last"):
        embed_now, calls = profile_run.embed_fields, [0]

        def out_of_memory(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if point == "dino-forward-last" and calls[0] == 1:
                return embed_now(*args, **kwargs)  # the first of two batches embeds
            raise RuntimeError(f"CUDA out of memory: tried to allocate 2.00 GiB (host {rank})")

        profile_run.embed_fields = out_of_memory  # type: ignore[assignment]
        return
    if point == "dino-metrics":

        def broken_metrics(*args: Any, **kwargs: Any) -> Any:
            raise FloatingPointError(f"the k-NN probe's distances overflowed (host {rank})")

        dino.profile_metrics = broken_metrics  # type: ignore[assignment]
        return
    if point == "setup-any":

        def unavailable(*args: Any, **kwargs: Any) -> Any:
            raise ConnectionError(f"gs://bucket/runs: HttpError 503: unavailable (host {rank})")

        loop.new_run_dir = unavailable  # type: ignore[assignment]
        return
    if point in ("resume-list", "resume-read"):

        def expired(*args: Any, **kwargs: Any) -> Any:
            raise PermissionError(
                f"gs://bucket/ckpt: HTTP 401: the token has expired (host {rank})"
            )

        name = "resume_url" if point == "resume-list" else "load_checkpoint"
        setattr(checkpoint, name, expired)
        return
    if point == "slow-setup":  # V-JEPA's setup or DINO's, whichever the config runs
        for job in (pretrain, dino):
            slow_read = _slow(job.read_manifest)
            job.read_manifest = slow_read  # type: ignore[attr-defined]
        return
    if point == "slow-save":
        save_now = CheckpointManager.save

        def slow_save(self: CheckpointManager, *args: Any, **kwargs: Any) -> str:
            Path(os.environ["POD_MARK"]).touch()
            time.sleep(3)
            return save_now(self, *args, **kwargs)

        CheckpointManager.save = slow_save  # type: ignore[method-assign]
        return
    if point == "checkpoint-any":

        def refused(self: CheckpointManager, *args: Any, **kwargs: Any) -> str:
            raise PermissionError(f"{self.url}: HTTP 401: the token has expired (host {rank})")

        CheckpointManager.save = refused  # type: ignore[method-assign]
        return
    if point == "checkpoint":

        def save(self: CheckpointManager, *args: Any, **kwargs: Any) -> str:
            raise CheckpointError(
                f"{self.url}: cannot write: no space left on device (host {rank})"
            )

        CheckpointManager.save = save  # type: ignore[method-assign]
        return
    split = {"data": "train", "validation": "val", "hang": "train"}[point]
    getitem, calls = ManifestDataset.__getitem__, [0]

    def failing(self: ManifestDataset, key: Any) -> dict[str, Any]:
        if self.split == split:
            calls[0] += 1
            if calls[0] > 8 and point == "hang":
                threading.Event().wait()
            if calls[0] > 8:  # the third batch of 4
                raise DataError(f"volume {key}: unreadable chunk in host {rank}'s cache")
        return getitem(self, key)

    ManifestDataset.__getitem__ = failing  # type: ignore[method-assign]


class Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []
        self.first: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage().splitlines()[0])
        self.first = self.first or time.time()


if __name__ == "__main__":
    rank = int(os.environ["RANK"])
    point, _, failing_rank = os.environ["POD_FAIL"].partition(":")
    if rank == int(failing_rank):
        inject(point, rank)
    errors = Errors()
    logging.getLogger("octtrain").addHandler(errors)
    out, args = Path(sys.argv[1]), [a.replace("{rank}", str(rank)) for a in sys.argv[2:]]
    code = main([os.environ.get("POD_JOB", "pretrain"), *args])
    record = {
        "code": code,
        "errors": errors.lines,
        "first_error": errors.first,
        "ended": time.time(),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    time.sleep(3)
    sys.exit(code)
