"""Checkpoints: one file per save in a local folder or under a gs:// prefix, written atomically.

A checkpoint folder holds ``step_XXXXXXXX.pt`` files and ``index.json`` (the saved steps in
order, their score, and the best one: the highest score), so finding the latest or best
checkpoint never lists a folder or a bucket. The checkpoint is written before the index, so a
crash mid-save leaves the previous index pointing at complete files. Files outside the last
``keep_last`` and the best are deleted only after the new index is in place.

Storage is fsspec's (local files, or gcsfs for gs://, which honours STORAGE_EMULATOR_HOST); a
local write goes to a temporary file renamed into place, an object upload is atomic by itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import math
import os
import pickle
import random
import warnings
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import torch
from fsspec.implementations.local import LocalFileSystem

from octstage.manifest import atomic_write_bytes
from octtrain.config.sections import CheckpointConfig
from octtrain.errors import CheckpointError, ConfigError

INDEX = "index.json"
# What each job's checkpoint is, as a refusal names the kind it found.
KINDS = {
    "pretrain": "a V-JEPA pretraining checkpoint (octtrain pretrain)",
    "dino": "a DINO pretraining checkpoint (octtrain pretrain, job: dino)",
    "finetune": "a fine-tuning checkpoint (octtrain finetune)",
}

# The way out when a run folder being resumed holds another job's run.
ANOTHER_JOB = (
    "the folder holds the run of another job: to resume, name the folder of a run of this job; "
    "for a new run, name another train.run_dir (or this one with train.overwrite=true: the old "
    "run is moved aside)"
)


def require_kind(state: dict[str, Any], where: str, wanted: tuple[str, ...], instead: str) -> None:
    """Refuse a checkpoint of another kind than ``wanted``, naming the file (``where``), the
    kind found, the kind needed and what to pass instead (``instead``): a checkpoint of another
    job would otherwise fail on a missing key (``KeyError: 'encoder'``) or load wrong weights."""
    kind = state.get("kind")
    if kind in wanted:
        return
    found = KINDS.get(str(kind), f"a checkpoint of kind {kind!r}, not one of octtrain's jobs")
    need = " or ".join(KINDS[k] for k in wanted)
    raise CheckpointError(f"{where}: {found}; this needs {need}: {instead}")


log = logging.getLogger("octtrain")


def checkpoint_dir(cfg: CheckpointConfig, run_dir: Path | None) -> str | None:
    """``cfg.dir`` if set, else ``<run_dir>/checkpoints`` (never a bucket named "None").

    None when neither is known: a non-main process of a run whose folder is new (timestamped),
    which has nothing to resume from and never writes checkpoints.
    """
    if cfg.dir is not None:
        return cfg.dir.rstrip("/")
    return None if run_dir is None else str(run_dir / "checkpoints")


def refuse_foreign_checkpoints(cfg: CheckpointConfig, resume: bool) -> None:
    """ConfigError when an explicit ``checkpoint.dir`` (outside the run folder, so the run-folder
    refusal cannot see it) already holds a run's index and this run does not resume it: a new
    run's saves and pruning would mix with that run's checkpoints and rewrite its index."""
    if cfg.dir is None or resume or Folder(cfg.dir).read(INDEX) is None:
        return
    raise ConfigError(
        f"checkpoint.dir {cfg.dir!r} already holds a run's checkpoints ({INDEX}); continue that "
        "run with checkpoint.resume=auto, or give this run a checkpoint.dir of its own "
        "(train.overwrite moves only train.run_dir aside)"
    )


class Folder:
    """One checkpoint folder (local path or URL): read, write atomically, delete by name."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/") or url  # "/" stays the root ("" would be the current folder)
        # An emulator (STORAGE_EMULATOR_HOST) takes no credentials; without this gcsfs would
        # first probe the cloud metadata server for them. Nor does it serve the gRPC storage
        # layout API that gcsfs >= 2025.x queries per bucket (60 s of retries, then a fallback to
        # plain JSON): switch that probe off before gcsfs is first imported.
        emulated = self.url.startswith("gs://") and os.environ.get("STORAGE_EMULATOR_HOST")
        options = {"token": "anon"} if emulated else {}
        if emulated:
            os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        try:
            self.fs, self.path = fsspec.core.url_to_fs(self.url, **options)
        except (ImportError, ValueError) as exc:
            raise CheckpointError(f"{url}: no storage backend available: {exc}") from exc
        self.local = isinstance(self.fs, LocalFileSystem)

    def where(self, name: str) -> str:
        """The object's URL, as messages name it (one slash after the root too)."""
        return f"{self.url.rstrip('/')}/{name}"

    def _key(self, name: str) -> str:
        return f"{self.path.rstrip('/')}/{name}"

    def read(self, name: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        try:
            data: bytes = self.fs.cat_file(self._key(name))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CheckpointError(f"{self.where(name)}: cannot read: {exc}") from exc
        return data

    def write(self, name: str, data: bytes) -> None:
        try:
            if self.local:
                atomic_write_bytes(Path(self.path) / name, data)
            else:
                self.fs.pipe_file(self._key(name), data)
        except OSError as exc:
            raise CheckpointError(f"{self.where(name)}: cannot write: {exc}") from exc

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._key(name))


def _finite(score: Any) -> bool:
    return isinstance(score, int | float) and math.isfinite(score)


def _split(url: str) -> tuple[str, str]:
    folder, sep, name = url.rstrip("/").rpartition("/")
    if not name:
        raise CheckpointError(f"{url!r} does not name a checkpoint file")
    # "/x.pt" splits into ("", "x.pt"): the root, not the current folder's x.pt (octstage's
    # storage.split_url keeps the same rule; octtrain imports only the manifest from octstage)
    return folder or ("/" if sep else "."), name


class CheckpointManager:
    """Saves and prunes the checkpoints of one folder (call it on the main process only)."""

    def __init__(self, url: str, keep_last: int, keep_best: bool) -> None:
        self.url = url.rstrip("/")
        self.keep_last = keep_last
        self.keep_best = keep_best
        self.folder = Folder(self.url)

    def index(self) -> dict[str, Any]:
        """``{"checkpoints": [{"name", "step", "score"}...], "best": entry | None}``."""
        data = self.folder.read(INDEX)
        if data is None:
            return {"checkpoints": [], "best": None}
        try:
            index: dict[str, Any] = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{self.url}/{INDEX}: not valid JSON: {exc}") from exc
        entries = index.get("checkpoints") if isinstance(index, dict) else None
        if not isinstance(entries, list) or not all(
            isinstance(e, dict) and isinstance(e.get("name"), str) for e in entries
        ):
            raise CheckpointError(
                f"{self.url}/{INDEX}: not a checkpoint index (no list of named checkpoints)"
            )
        index.setdefault("best", None)
        # An older version wrote NaN scores (and could make one the best): not scores at all.
        for entry in [*index["checkpoints"], index["best"] or {}]:
            if entry.get("score") is not None and not _finite(entry["score"]):
                log.warning(
                    "%s/%s: %s has score %s; read as none",
                    self.url,
                    INDEX,
                    entry["name"],
                    entry["score"],
                )
                entry["score"] = None
        if index["best"] is not None and index["best"]["score"] is None:
            index["best"] = None
        return index

    def latest(self) -> str | None:
        """URL of the newest checkpoint in this folder, or None when there is none."""
        entries = self.index()["checkpoints"]
        return f"{self.url}/{entries[-1]['name']}" if entries else None

    def best(self) -> str | None:
        """URL of the checkpoint with the highest score, or None."""
        best = self.index()["best"]
        return f"{self.url}/{best['name']}" if best else None

    def save(
        self,
        state: dict[str, Any],
        step: int,
        score: float | None = None,
        is_best: bool | None = None,
    ) -> str:
        """Write ``state`` as the checkpoint of ``step`` (``score``: higher is better, None for
        a step without validation); returns its URL.

        ``is_best`` is the caller's verdict (the trainer's early-stopping rule, so the best
        checkpoint and the best validation are one step); None applies this folder's own rule,
        a finite score above the best one. A non-finite score (an undefined metric) is never the
        best and is stored as null: a bare NaN is not JSON, and ``score > nan`` is never true,
        so a NaN best would stay best for good.
        """
        name = f"step_{step:08d}.pt"
        buffer = io.BytesIO()
        torch.save(state, buffer)
        self.folder.write(name, buffer.getvalue())
        index = self.index()
        if score is not None and not math.isfinite(score):
            log.warning(
                "%s: step %d has a non-finite score (%s); never the best", name, step, score
            )
            score, is_best = None, False
        entry = {"name": name, "step": step, "score": score}
        entries = [e for e in index["checkpoints"] if e["name"] != name] + [entry]
        best = index["best"]
        if is_best is None:
            is_best = score is not None and (best is None or score > best["score"])
        if self.keep_best and is_best:
            best = entry
        keep = {e["name"] for e in entries[-self.keep_last :]}
        if best is not None:
            keep.add(best["name"])
        new_index = {"checkpoints": [e for e in entries if e["name"] in keep], "best": best}
        self.folder.write(INDEX, json.dumps(new_index, indent=1, allow_nan=False).encode())
        for e in entries:
            if e["name"] not in keep:
                self.folder.delete(e["name"])
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
    # A local file is read as a checkpoint whatever its name (never as a folder's index.json).
    if not name.endswith(".pt") and not ("://" not in url and Path(url).is_file()):
        latest = CheckpointManager(url, keep_last=1, keep_best=False).latest()
        if latest is None:
            raise CheckpointError(f"{url}: no checkpoint found (no {INDEX} or it is empty)")
        folder, name = _split(latest)
    store = Folder(folder)
    data = store.read(name)
    if data is None:
        raise CheckpointError(f"{store.where(name)}: cannot read checkpoint: no such file")
    return state_from_bytes(data, store.where(name))


def state_from_bytes(data: bytes, where: str) -> dict[str, Any]:
    """The state saved in ``data`` (tensors on CPU); ``where`` names the file in the error.

    Damaged bytes fail in torch's weights-only unpickler with whatever the garbage trips over
    (IndexError, KeyError, UnicodeDecodeError, UnpicklingError, ...), so every failure but
    running out of memory is "not a readable checkpoint"."""
    try:
        with warnings.catch_warnings():
            # garbage often "detects" an unknown pickle protocol before it fails
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except MemoryError:
        raise
    except Exception as exc:
        # torch's reasons run over several lines (weights-only advice); the first one says it.
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        known = isinstance(exc, RuntimeError | EOFError | ValueError | pickle.UnpicklingError)
        reason = first if known and first else f"damaged data ({type(exc).__name__}: {first})"
        raise CheckpointError(f"{where}: not a readable checkpoint: {reason}") from exc
    if not isinstance(state, dict):
        raise CheckpointError(f"{where}: not a checkpoint (holds a {type(state).__name__})")
    return state


def resolve_checkpoint(url: str) -> str:
    """A checkpoint file as given; a checkpoint folder means its best checkpoint, else latest."""
    if url.rstrip("/").endswith(".pt"):
        return url
    manager = CheckpointManager(url, keep_last=1, keep_best=True)
    found = manager.best() or manager.latest()
    if found is None:
        raise CheckpointError(f"{url}: no checkpoint found (no index.json or it is empty)")
    return found


def checkpoint_sha256(url: str) -> str:
    """``sha256:<hex>`` of a checkpoint file's bytes (what a cache of its outputs is keyed by)."""
    folder, name = _split(url)
    store = Folder(folder)
    data = store.read(name)
    if data is None:
        raise CheckpointError(f"{store.where(name)}: cannot read checkpoint: no such file")
    return "sha256:" + hashlib.sha256(data).hexdigest()


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
