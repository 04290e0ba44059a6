"""Checkpoints: one file per save in a local folder or under a gs:// prefix, written atomically.

A checkpoint folder holds ``step_XXXXXXXX.pt`` files and ``index.json`` (the saved steps in
order, their metric, and the best one), so finding the latest or best checkpoint never lists a
folder or a bucket. The checkpoint is written before the index, so a crash mid-save leaves the
previous index pointing at complete files. Files outside the last ``keep_last`` and the best are
deleted only after the new index is in place.
"""

from __future__ import annotations

import io
import json
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from octstage.errors import StorageError
from octstage.storage import Storage, open_storage
from octtrain.config import CheckpointConfig
from octtrain.errors import CheckpointError

INDEX = "index.json"


def checkpoint_dir(cfg: CheckpointConfig, run_dir: Path | None) -> str | None:
    """``cfg.dir`` if set, else ``<run_dir>/checkpoints`` (never a bucket named "None").

    None when neither is known: a non-main process of a run whose folder is new (timestamped),
    which has nothing to resume from and never writes checkpoints.
    """
    if cfg.dir is not None:
        return cfg.dir.rstrip("/")
    return None if run_dir is None else str(run_dir / "checkpoints")


def _storage(url: str) -> Storage:
    try:
        return open_storage(url)
    except ImportError as exc:
        raise CheckpointError(f"{url}: no storage backend available: {exc}") from exc


def _split(url: str) -> tuple[str, str]:
    folder, _, name = url.rstrip("/").rpartition("/")
    if not name:
        raise CheckpointError(f"{url!r} does not name a checkpoint file")
    return folder or ".", name


class CheckpointManager:
    """Saves and prunes the checkpoints of one folder (call it on the main process only)."""

    def __init__(self, url: str, keep_last: int, keep_best: bool) -> None:
        self.url = url.rstrip("/")
        self.keep_last = keep_last
        self.keep_best = keep_best
        self.storage = _storage(self.url)

    def index(self) -> dict[str, Any]:
        """``{"checkpoints": [{"name", "step", "metric"}...], "best": entry | None}``."""
        try:
            data = self.storage.read_bytes(INDEX)
        except StorageError:
            return {"checkpoints": [], "best": None}
        try:
            index: dict[str, Any] = json.loads(data)
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{self.url}/{INDEX}: not valid JSON: {exc}") from exc
        return index

    def latest(self) -> str | None:
        """URL of the newest checkpoint in this folder, or None when there is none."""
        entries = self.index()["checkpoints"]
        return f"{self.url}/{entries[-1]['name']}" if entries else None

    def best(self) -> str | None:
        """URL of the checkpoint with the lowest metric, or None."""
        best = self.index()["best"]
        return f"{self.url}/{best['name']}" if best else None

    def save(self, state: dict[str, Any], step: int, metric: float | None = None) -> str:
        """Write ``state`` as the checkpoint of ``step``; returns its URL."""
        name = f"step_{step:08d}.pt"
        buffer = io.BytesIO()
        torch.save(state, buffer)
        try:
            self.storage.write_bytes(name, buffer.getvalue())
        except (StorageError, OSError) as exc:
            raise CheckpointError(f"{self.url}/{name}: cannot write checkpoint: {exc}") from exc
        index = self.index()
        entry = {"name": name, "step": step, "metric": metric}
        entries = [e for e in index["checkpoints"] if e["name"] != name] + [entry]
        best = index["best"]
        if self.keep_best and metric is not None and (best is None or metric < best["metric"]):
            best = entry
        keep = {e["name"] for e in entries[-self.keep_last :]}
        if best is not None:
            keep.add(best["name"])
        new_index = {"checkpoints": [e for e in entries if e["name"] in keep], "best": best}
        self.storage.write_bytes(INDEX, json.dumps(new_index, indent=1).encode())
        for e in entries:
            if e["name"] not in keep:
                self.storage.delete(e["name"])
        return f"{self.url}/{name}"


def rng_state() -> dict[str, Any]:
    """Every global RNG's state, in types ``torch.load(weights_only=True)`` accepts."""
    np_state = np.random.get_state(legacy=False)
    np_state["state"] = {k: np.asarray(v).tolist() for k, v in np_state["state"].items()}
    state = {"torch": torch.get_rng_state(), "numpy": np_state, "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` saved."""
    torch.set_rng_state(state["torch"])
    np_state = dict(state["numpy"])
    np_state["state"] = {k: np.asarray(v, dtype=np.uint64) for k, v in np_state["state"].items()}
    np.random.set_state(np_state)
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def to_cpu(value: Any) -> Any:
    """``value`` with every tensor detached and on the CPU (so any device can load it)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(to_cpu(v) for v in value)
    return value


def load_checkpoint(url: str) -> dict[str, Any]:
    """A checkpoint's state (tensors on CPU). ``url`` is a checkpoint file, or a checkpoint
    folder, meaning its latest checkpoint."""
    folder, name = _split(url)
    if not name.endswith(".pt"):
        latest = CheckpointManager(url, keep_last=1, keep_best=False).latest()
        if latest is None:
            raise CheckpointError(f"{url}: no checkpoint found (no {INDEX} or it is empty)")
        folder, name = _split(latest)
    try:
        data = _storage(folder).read_bytes(name)
    except (StorageError, OSError) as exc:
        raise CheckpointError(f"{folder}/{name}: cannot read checkpoint: {exc}") from exc
    try:
        state: dict[str, Any] = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"{folder}/{name}: not a readable checkpoint: {exc}") from exc
    return state


def resume_url(cfg: CheckpointConfig, directory: str | None) -> str | None:
    """None (fresh start), the latest checkpoint in ``directory`` ("auto"), or ``cfg.resume``."""
    if cfg.resume is None:
        return None
    if cfg.resume == "auto":
        if directory is None:
            return None
        return CheckpointManager(directory, keep_last=1, keep_best=False).latest()
    return cfg.resume


def load_encoder_state(
    url: str, key: str = "target_encoder"
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """An encoder's weights from a pretraining checkpoint, and the run's model config (as data).

    V-JEPA evaluates and fine-tunes the EMA (target) encoder; ``key="encoder"`` gives the online
    one. Build the encoder with ``ModelConfig`` from the returned dict, then load the weights.
    """
    state = load_checkpoint(url)
    if key not in state:
        raise CheckpointError(f"{url}: no {key!r} in checkpoint (keys: {sorted(state)})")
    return state[key], state["config"]["model"]
