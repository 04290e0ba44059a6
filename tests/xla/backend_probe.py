"""Probe the XLA backend on real batches (the XLA tier's subprocess for backend-level checks).

``python -m tests.xla.backend_probe MANIFEST`` builds ``make_backend("xla", "bf16")`` and feeds
the first training batch of the manifest through ``wrap_loader``; prints one line
``XLA-RESULT {json}`` with the backend's topology, the sharding torch_xla recorded for each
tensor of the batch, sums over the batch on the device and on the host, and the autocast dtype.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch_xla

from octstage.manifest import load
from octtrain.config.sections import DataConfig
from octtrain.data.dataset import ManifestDataset, Transform, volume_shape
from octtrain.data.loaders import train_loader
from octtrain.runtime.backend import make_backend
from octtrain.runtime.xla import XlaBackend

RESULT_PREFIX = "XLA-RESULT "


def probe(manifest_path: Path) -> dict[str, Any]:
    backend = make_backend("xla", "bf16")
    assert isinstance(backend, XlaBackend)  # the factory's lazy import found the real one
    manifest = load(manifest_path)
    shape = volume_shape(manifest.split("train"))
    dataset = ManifestDataset(manifest, manifest_path.parent, "train", Transform(shape, None))

    def loader() -> Any:
        cfg = DataConfig(num_workers=0)
        return train_loader(dataset, cfg, 8, backend.process_index, backend.process_count, 0)

    batch = next(iter(backend.wrap_loader(loader())))
    host_batch = next(iter(loader()))  # same sampler seed: the same samples, left on the host
    index_sum = backend.reduce_step_sum(batch["index"].sum())
    image_sum = backend.reduce_step_sum(batch["image"].double().sum())
    weight = torch.randn(4, batch["image"][0].numel()).to(backend.device)
    with backend.autocast():
        logits = torch.nn.functional.linear(batch["image"].flatten(1).float(), weight)
    backend.barrier()
    backend.sync()
    result = {
        "kind": backend.kind,
        "spmd": backend.spmd,
        "device": str(backend.device),
        "world_size": backend.world_size,
        "rank": backend.rank,
        "process_index": backend.process_index,
        "process_count": backend.process_count,
        "is_main": backend.is_main,
        "shardings": {
            key: torch_xla._XLAC._get_xla_sharding_spec(value)
            for key, value in batch.items()
            if isinstance(value, torch.Tensor)
        },
        "shapes": {k: list(v.shape) for k, v in batch.items() if isinstance(v, torch.Tensor)},
        "participant_ids": batch["participant_id"],
        "host_participant_ids": host_batch["participant_id"],
        "index_sum": int(index_sum.cpu()),
        "host_index_sum": int(host_batch["index"].sum()),
        "image_sum": float(image_sum.cpu()),
        "host_image_sum": float(host_batch["image"].double().sum()),
        "autocast_dtype": str(logits.dtype),
        "compile_count": backend.compile_count(),
    }
    backend.close()
    return result


if __name__ == "__main__":
    print(RESULT_PREFIX + json.dumps(probe(Path(sys.argv[1]))), flush=True)
