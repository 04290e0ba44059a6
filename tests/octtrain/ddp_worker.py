"""Run by torchrun in the multi-process tests: one rank (one simulated host) of a gloo
pretraining run.

``{rank}`` in an override becomes this process's rank, so each simulated host can have its own
local folder (``checkpoint.dir=/tmp/x/host{rank}``), as on a pod where each host has its own
disk. Writes ``<out>/rank<r>.json`` with the sample indices of its first batches (from the exact
loader the run uses; skipped with POD_PEEK=0), a checksum of its final weights, its own loss at
every step and its result.

``POD_DISK`` (a folder, ``{rank}`` replaced) is this host's working folder: a relative path such
as ``checkpoint.dir=ckpt`` then names the same path on different disks, as on a pod, and no host
can read another's files through it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from octstage.manifest import load
from octtrain.config.loader import load_config
from octtrain.config.pretrain import PretrainConfig
from octtrain.runtime.backend import make_backend
from octtrain.train.job import StepResult
from octtrain.train.loop import Trainer
from octtrain.train.pretrain import PretrainJob, resolve, settings


def main(config_path: str, out: str, overrides: list[str]) -> None:
    torch.set_num_threads(1)
    rank = os.environ.get("RANK", "0")
    if "POD_DISK" in os.environ:
        disk = Path(os.environ["POD_DISK"].replace("{rank}", rank))
        disk.mkdir(parents=True, exist_ok=True)
        os.chdir(disk)
    overrides = [o.replace("{rank}", rank) for o in overrides]
    cfg = load_config(PretrainConfig, config_path, overrides)
    assert cfg.data.manifest is not None
    manifest = load(cfg.data.manifest)
    cfg = resolve(cfg, manifest)
    backend = make_backend("cpu")
    try:
        job = PretrainJob(cfg, manifest, backend)
        seen = []
        if os.environ.get("POD_PEEK", "1") == "1":
            batches = iter(job.start(0))  # the loader the run itself builds
            seen = [next(batches)["index"].tolist() for _ in range(4)]
            del batches
        losses: dict[int, float] = {}  # this host's own loss per step, before any reduction
        step_fn = job.train_step

        def recording_step(batch: dict[str, Any], step: int) -> StepResult:
            out = step_fn(batch, step)
            losses[step] = float(out.loss)
            return out

        job.train_step = recording_step  # type: ignore[method-assign]
        result = Trainer(job, settings(cfg), backend).run()
        digest = hashlib.sha256()
        for tensor in job.raw.state_dict().values():
            digest.update(tensor.numpy().tobytes())
        record = {
            "rank": backend.rank,
            "world_size": backend.world_size,
            "indices": seen,
            "weights": digest.hexdigest(),
            "run_dir": str(result.run_dir) if result.run_dir else None,
            "checkpoint": result.last_checkpoint,
            "steps": result.steps,
            "last_loss": result.last_loss,
            "losses": losses,
        }
        Path(out, f"rank{backend.rank}.json").write_text(json.dumps(record))
    finally:
        backend.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
