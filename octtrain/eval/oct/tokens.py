"""Frozen encoder tokens of one split, computed once and cached on disk.

A probe trains many small heads (a learning-rate grid, two probe kinds) on the same frozen
features; running the encoder once per split and reading the tokens back afterwards is what
makes that cheap. The cache file is keyed by everything the tokens depend on: the checkpoint's
bytes (sha256), which encoder (EMA target, online context, or a finetuned model's), the input
shape, and the split's volumes (their Zarr paths and the manifest's checksums of their values,
in order). A changed checkpoint, volume or split is a different key, never a stale hit.

Tokens are stored as float16 (half the disk and memory of float32; a probe on them reads them
back as float32): ``<dir>/<split>-<key>.pt`` holds ``tokens`` (N, T, D), ``labels`` (N,) and
the ``zarr_paths`` they belong to.
"""

from __future__ import annotations

import hashlib
import io
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

from octstage.manifest import Manifest, Volume, atomic_write_bytes
from octtrain.data.dataset import ManifestDataset, Transform
from octtrain.embed.encode import volume_tokens
from octtrain.errors import CheckpointError, DataError
from octtrain.runtime.backend import Backend
from octtrain.runtime.checkpoint import state_from_bytes

log = logging.getLogger("octtrain")


@dataclass(frozen=True)
class Frozen:
    """A split's frozen tokens (float16, on CPU) and labels."""

    tokens: torch.Tensor
    labels: torch.Tensor
    key: str
    cached: bool  # read from the cache (True) or computed now


def feature_key(
    checkpoint_sha: str, encoder: str, shape: tuple[int, int, int], volumes: Sequence[Volume]
) -> str:
    """16 hex digits naming one (checkpoint, encoder, input shape, split) combination."""
    h = hashlib.sha256(f"{checkpoint_sha}\n{encoder}\n{list(shape)}\n".encode())
    for v in volumes:
        h.update(f"{v.zarr_path} {v.checksum}\n".encode())
    return h.hexdigest()[:16]


def _read(path: Path, key: str, volumes: Sequence[Volume]) -> Frozen | None:
    try:
        saved = state_from_bytes(path.read_bytes(), str(path))
    except FileNotFoundError:
        return None
    except (OSError, CheckpointError) as exc:
        log.warning("%s: unreadable feature cache (%s); computing the features again", path, exc)
        return None
    if saved.get("zarr_paths") != [v.zarr_path for v in volumes]:
        log.warning("%s: lists other volumes; computing the features again", path)
        return None
    return Frozen(saved["tokens"], saved["labels"], key, cached=True)


def split_features(
    encoder: nn.Module,
    manifest: Manifest,
    cache_root: Path,
    split: str,
    shape: tuple[int, int, int],
    key: str,
    folder: Path,
    backend: Backend,
    batch_size: int,
) -> Frozen:
    """The split's tokens from ``folder`` when cached under ``key``; else computed and saved."""
    volumes = manifest.split(split)
    path = folder / f"{split}-{key}.pt"
    found = _read(path, key, volumes)
    if found is not None:
        log.info("%s features: %d volumes from %s", split, len(volumes), path)
        return found
    dataset = ManifestDataset(manifest, cache_root, split, Transform(shape, None))
    encoder.eval().to(backend.device)
    chunks, labels = [], []
    with torch.no_grad():
        for batch in DataLoader(dataset, batch_size=batch_size):
            tokens = volume_tokens(encoder, batch, backend)
            chunks.append(tokens.to(torch.float16).cpu())
            labels.append(batch["label"].to(torch.int64))
    if not chunks:
        raise DataError(f"split {split!r} has no volumes in the manifest")
    frozen = Frozen(torch.cat(chunks), torch.cat(labels), key, cached=False)
    buffer = io.BytesIO()
    saved = {
        "tokens": frozen.tokens,
        "labels": frozen.labels,
        "zarr_paths": [v.zarr_path for v in volumes],
    }
    torch.save(saved, buffer)
    atomic_write_bytes(path, buffer.getvalue())
    log.info("%s features: %d volumes computed, saved to %s", split, len(volumes), path)
    return frozen
