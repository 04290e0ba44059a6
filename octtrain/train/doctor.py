"""``octtrain doctor``: before a pod run, check that every host would run the same thing.

Run on every host at once, as the training command would be (same backend, same config): each
host describes what it sees, namely its code version, the manifest's checksum, the cache (the
manifest's per-volume checksums of the volumes whose files are present: cheap, nothing is
read), the attention kernel it would use and why (and, for flash, whether the lengths fit), and
the device mesh. One host sum assembles every host's line on every host; process 0 prints one
line per host, every host prints the verdict, and all exit 0 when the hosts agree, 2 (naming
what differs) when not.
"""

from __future__ import annotations

import hashlib
import json
import socket
from pathlib import Path

import torch

from octstage.manifest import Item
from octtrain.config.dino import DinoConfig
from octtrain.config.finetune import FinetuneConfig
from octtrain.config.pretrain import PretrainConfig
from octtrain.data.dataset import read_manifest
from octtrain.errors import DataError, OcttrainError
from octtrain.runtime.backend import Backend, make_backend
from octtrain.runtime.rundir import code_version
from octtrain.train.pretrain import check_kernel, resolve

# The configs a run launches with: doctor reads the one the run will use.
DoctorConfig = PretrainConfig | DinoConfig | FinetuneConfig
# What every host must see alike; "host" (the machine's name) differs by design.
AGREED = ("code", "manifest", "cache", "attention", "mesh")


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()[:16]


def _has_data(root: Path, item: Item) -> bool:
    """Whether the item's array folder holds its metadata and at least one data object (a
    cache whose chunks were all deleted would read as fill values, or fail mid-run)."""
    array = root / item.array_path
    if not (array / "zarr.json").is_file():
        return False
    return any(p.is_file() for p in (array / "c").rglob("*")) if (array / "c").is_dir() else False


def describe(cfg: DoctorConfig, backend: Backend) -> dict[str, str]:
    """This host's view: what ``AGREED`` names, plus its name. A cache that cannot train (the
    manifest check fatal for ``doctor``: no items, the other kind, contradictions; or items
    without their data in the cache) is this host's ``refused`` entry: every host must reach
    the gathering, or the others would wait there for it."""
    try:
        return _describe(cfg, backend)
    except DataError as exc:
        return {"host": _host(backend), "refused": str(exc)[:1500], **dict.fromkeys(AGREED, "-")}


def _host(backend: Backend) -> str:
    return f"{backend.process_index} ({socket.gethostname()})"


def _describe(cfg: DoctorConfig, backend: Backend) -> dict[str, str]:
    assert cfg.data.manifest is not None
    manifest_path = Path(cfg.data.manifest)
    kind = "cellpainting" if isinstance(cfg, DinoConfig) else "oct"
    # The findings fatal for the job this config launches stop doctor too: it agrees to what
    # the run would accept, no more and no less.
    job = "finetune" if isinstance(cfg, FinetuneConfig) else "pretrain"
    manifest = read_manifest(str(manifest_path), job, kind)
    root = Path(cfg.data.cache) if cfg.data.cache else manifest_path.parent
    items = manifest.items
    what = "fields" if kind == "cellpainting" else "volumes"
    present = [v for v in items if (root / v.zarr_path).exists()]
    empty = [v.zarr_path for v in present if not _has_data(root, v)]
    if len(present) < len(items) or empty:
        missing = [v.zarr_path for v in items if v not in present]
        raise DataError(
            f"cache {root} cannot feed a run of {manifest_path}: {len(missing)} of {len(items)} "
            f"items missing ({', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}), "
            f"{len(empty)} without data objects ({', '.join(empty[:3])}"
            f"{' ...' if len(empty) > 3 else ''}); run octstage verify"
        )
    listing = "\n".join(sorted(f"{v.zarr_path} {v.checksum}" for v in present))
    if isinstance(cfg, PretrainConfig):
        try:
            kernel, why = check_kernel(resolve(cfg, manifest), backend.device)
            attention = f"{kernel} ({why})"
        except OcttrainError as exc:
            attention = f"refused: {exc}"
    else:  # the kernel of these jobs is chosen and checked when they start
        attention = f"{type(cfg).__name__}: checked at launch"
    return {
        "host": _host(backend),
        "code": code_version(),
        "manifest": _digest(manifest_path.read_bytes()),
        "cache": f"{len(present)}/{len(items)} {what} {_digest(listing.encode())}",
        "attention": attention,
        "mesh": (
            f"{backend.kind}: {backend.world_size} device(s) over {backend.process_count} "
            f"host(s), {backend.world_size // max(1, backend.process_count)} per host"
        ),
    }


def line(view: dict[str, str]) -> str:
    """One host's line."""
    return f"host {view['host']}: " + ", ".join(f"{k} {view[k]}" for k in AGREED)


def gather_text(backend: Backend, text: str, width: int = 4096) -> list[str]:
    """Every process's ``text`` (UTF-8, at most ``width`` bytes), in process order, everywhere."""
    table = torch.zeros(backend.process_count, width, dtype=torch.int64)
    data = text.encode("utf-8")[:width]
    table[backend.process_index, : len(data)] = torch.tensor(list(data), dtype=torch.int64)
    table = backend.reduce_host_sum(table) if backend.process_count > 1 else table
    rows = [bytes(int(b) for b in row).rstrip(b"\0") for row in table.tolist()]
    return [row.decode("utf-8", "replace") for row in rows]


def disagreements(views: list[dict[str, str]]) -> list[str]:
    """One sentence per key on which some host differs from host 0."""
    found = []
    for key in AGREED:
        odd = [v["host"] for v in views[1:] if v[key] != views[0][key]]
        if odd:
            found.append(f"{key} differs from host 0's on host(s) {', '.join(odd)}")
    return found


def run_doctor(cfg: DoctorConfig) -> tuple[list[str], list[str]]:
    """Check every host: (the lines to print: every host's on process 0, none elsewhere; what
    differs, the same on every host)."""
    backend = make_backend(cfg.train.device, cfg.train.precision, None)
    try:
        views = [json.loads(t) for t in gather_text(backend, json.dumps(describe(cfg, backend)))]
    finally:
        backend.close()
    refused = [f"host {v['host']}: {v['refused']}" for v in views if "refused" in v]
    if refused:  # the same on every host: each one raises it
        raise DataError("doctor: " + "; ".join(refused))
    return ([line(v) for v in views] if backend.is_main else []), disagreements(views)
