"""Run by torchrun in the DINO multi-process test: one rank of a gloo DINOv2 run on the tiny
Cell Painting cache (its ``manifest.json``, a real Cell Painting manifest).

Writes ``<out>/rank<r>.json``: world size, the class of the model the step ran (the wrapper),
a checksum of the final student weights (gathered under FSDP) and the run folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import get_model_state_dict

from octstage.manifest import load
from octtrain.config.dino import DinoConfig
from octtrain.config.loader import load_config
from octtrain.runtime.backend import make_backend
from octtrain.train.dino import FULL_IN, DinoJob, manifest_fields
from octtrain.train.job import Settings
from octtrain.train.loop import Trainer


def main(config_path: str, cache: str, out: str, overrides: list[str]) -> None:
    torch.set_num_threads(1)
    cfg = load_config(DinoConfig, config_path, overrides)
    backend = make_backend("cpu")
    # The trainer closes the backend at its end; this worker gathers the weights after the run
    # (a collective under FSDP), so it keeps the process group until then.
    close, backend.close = backend.close, lambda: None  # type: ignore[method-assign]
    try:
        fields = manifest_fields(load(Path(cache) / "manifest.json"), cfg.data.train_split)
        job = DinoJob(cfg, fields, Path(cache), backend)
        result = Trainer(job, Settings.of(cfg), backend).run()  # type: ignore[arg-type]
        state = get_model_state_dict(job.raw, options=FULL_IN)  # a collective under FSDP
        digest = hashlib.sha256()
        for key in sorted(state):
            value = state[key]
            assert isinstance(value, torch.Tensor)
            digest.update(value.numpy().tobytes())
        record = {
            "world_size": backend.world_size,
            "wrapper": type(job.student).__name__,
            "weights": digest.hexdigest(),
            "run_dir": None if result.run_dir is None else str(result.run_dir),
            "steps": result.steps,
        }
        Path(out, f"rank{backend.rank}.json").write_text(json.dumps(record))
    finally:
        close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
    os._exit(0)
