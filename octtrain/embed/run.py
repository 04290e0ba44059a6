"""``octtrain embed``: every item's embedding, in the layout the field's own tools read.

One process, or several under ``torchrun`` (gloo on CPU, NCCL on GPUs), on one host or many
(``--out`` on storage every host can write, as a run folder is): the selected items are cut into
parts (``parts.plan``), each process embeds its share (``parts.mine``) with the checkpoint's
encoder (``encoders``; ``encode``: the one definition of an item's embedding that ``profile``
and ``probe`` use too), its loader workers reading and tiling ahead (``items``), and writes each
part a row group at a time. Process 0 resolves the checkpoint once and every process's identity
is compared with its own at setup (``agree_identity``); the processes then agree after every
batch (``runtime.hosts.agree``: no process waits for more than a batch of the slowest, and a
failure on one host stops every host with its message), and process 0 writes the per-well
(per-participant) table and, last, the header (``export``), the others agreeing with it every
few seconds (``hosts.beating``).

Resuming is the same command: a part whose record and checksum match is kept, a missing or
damaged one is embedded again, and a finished export re-run embeds nothing. Ctrl-C (exit 130)
and SIGTERM (143) keep every finished part; the part in progress leaves no file that looks
finished, and the temporary files a SIGKILL leaves are removed by the next run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch

from octstage.manifest import (
    Manifest,
    atomic_write_text,
    claim_export_folder,
    refuse_inside_cache,
)
from octtrain import __version__
from octtrain.config.embed import EmbedConfig
from octtrain.data.dataset import read_manifest
from octtrain.embed import export
from octtrain.embed.encode import VERSIONS, embed_fields, pool_tokens, volume_tokens
from octtrain.embed.encoders import Encoder, checkpoint_encoder
from octtrain.embed.items import check_items, parts_loader
from octtrain.embed.parts import (
    Part,
    PartWriter,
    check_part,
    mine,
    plan,
    sha256_file,
    temporary,
)
from octtrain.embed.summary import Progress
from octtrain.embed.tables import GROUPS, item_batch, item_schema, metadata_columns
from octtrain.errors import ConfigError, DataError, OcttrainError
from octtrain.runtime import hosts
from octtrain.runtime.backend import Backend, cpu_threads, make_backend, resolve_kind
from octtrain.runtime.checkpoint import checkpoint_sha256, load_checkpoint, resolve_checkpoint

log = logging.getLogger("octtrain")


@dataclass
class Setup:
    """What every process knows before it embeds."""

    encoder: Encoder
    items: Sequence[Any]
    root: Path
    identity: dict[str, Any]
    checkpoint: dict[str, Any]
    manifest: dict[str, Any]
    complete: bool  # process 0 found a finished export of this identity


def _selection(manifest: Manifest, path: str, split: str | None) -> Sequence[Any]:
    if split is None:
        return manifest.items
    items: Sequence[Any] = (
        manifest.split_fields(split) if manifest.kind == "cellpainting" else manifest.split(split)
    )
    if not len(items):
        column = getattr(manifest.items, "column", None)  # the columnar form: no item built
        found = sorted(set(column("split") if column else [i.split for i in manifest.items]))
        raise ConfigError(f"--split {split!r}: {path} has no items in it (its splits: {found})")
    return items


def _file_sha256(path: str) -> str:
    try:
        return sha256_file(Path(path))
    except OSError as exc:
        raise DataError(f"{path}: cannot read the manifest ({exc.strerror})") from None


def _locate(cfg: EmbedConfig, backend: Backend) -> str:
    """On process 0: ``--out`` checked (before minutes of loading) and the checkpoint file
    resolved (best, else latest) once for every process, so a folder that training moves on
    cannot give two processes two checkpoints. The others: ""."""
    if not backend.is_main:
        return ""
    refuse_inside_cache(Path(cfg.out), ConfigError, "--out")
    return resolve_checkpoint(cfg.checkpoint)


def setup(cfg: EmbedConfig, backend: Backend, url: str) -> Setup:
    """The encoder (of checkpoint file ``url``), the items and the export's identity; on process
    0 the folder is claimed (one output-folder rule), the plan written and an earlier run's
    temporary files removed. Refusals name the file and the way out."""
    state = load_checkpoint(url)
    encoder = checkpoint_encoder(state, url, cfg.encoder)
    manifest = read_manifest(cfg.manifest, "embed", None)
    if manifest.kind != encoder.data_kind:
        raise DataError(
            f"{cfg.manifest} lists {manifest.kind} items and {url} is a {state.get('kind')} "
            f"checkpoint, which embeds {encoder.data_kind} items: embed each kind with a "
            "checkpoint trained on it"
        )
    items = _selection(manifest, cfg.manifest, cfg.split)[: cfg.limit]
    check_items(items, encoder, cfg.manifest)
    identity = {
        "kind": manifest.kind,
        "checkpoint_sha256": checkpoint_sha256(url),
        "encoder": encoder.name,
        "manifest_sha256": _file_sha256(cfg.manifest),
        "split": cfg.split,
        "limit": cfg.limit,
        "items": len(items),
        "part_size": cfg.part_size,
        "prefix": cfg.prefix,
        "embedding_version": VERSIONS[manifest.kind],
        # bf16 autocast on CUDA: a resume on another precision would mix parts of two
        "precision": "bf16" if isinstance(backend.autocast(), torch.autocast) else "fp32",
    }
    folder, complete = Path(cfg.out), False
    if backend.is_main:
        earlier = claim_export_folder(folder, export.PLAN, export.own, identity, ConfigError)
        if earlier is None:
            started = {**identity, "processes": backend.process_count, "started": _now()}
            atomic_write_text(folder / export.PLAN, json.dumps(started, indent=2))
        for name in export.remove_stale(folder):
            log.warning("%s: a temporary file an earlier run left; removed", folder / name)
        if earlier is not None and earlier.get("processes") != backend.process_count:
            log.info(
                "resuming an export started on %s process(es), now on %d: its parts do not depend "
                "on the number of processes",
                earlier.get("processes"),
                backend.process_count,
            )
        complete = export.header_matches(folder, identity)
    checkpoint = {"path": url, "step": encoder.step, "sha256": identity["checkpoint_sha256"]}
    checkpoint["encoder"] = encoder.name
    described = {"path": cfg.manifest, "sha256": identity["manifest_sha256"]}
    described |= {"kind": manifest.kind, "items": len(manifest.items)}
    root = Path(cfg.cache) if cfg.cache else Path(cfg.manifest).parent
    return Setup(encoder, items, root, identity, checkpoint, described, complete)


def agree_identity(backend: Backend, s: Setup) -> None:
    """Every process embeds what process 0 does: the same manifest, selection and checkpoint
    bytes, the same encoder and embedding version (process 0's alone names the folder and goes
    into the header). A process that read another manifest of the same length, or another
    checkpoint, is refused here on every process, both values named."""
    if backend.process_count == 1:
        return
    mine = s.identity  # the encoder's config is the checkpoint's: its SHA-256 covers it
    main: dict[str, Any] = backend.broadcast_object(mine)
    failure = None
    for key, value in mine.items():
        if value != main.get(key):
            failure = ConfigError(
                f"process {backend.process_index} read {key} {value!r}, process 0 read "
                f"{main.get(key)!r}: every process must embed the same items with the same "
                "checkpoint (the same --manifest and --checkpoint files on every host)"
            )
            break
    hosts.agree(backend, failure, "agreeing on what to embed")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def embed_batch(encoder: Encoder, batch: dict[str, Any], backend: Backend) -> np.ndarray:
    """``[n, dim]`` float32 embeddings of one loader batch."""
    if encoder.data_kind == "cellpainting":
        with backend.autocast():  # bf16 on CUDA (the identity's precision), fp32 on CPU
            return embed_fields(encoder.module, batch["tiles"], backend.device)
    tokens = volume_tokens(encoder.module, batch, backend)
    return pool_tokens(tokens).cpu().numpy().astype(np.float32)


class PartSink:
    """Rows arriving in item order, written into their parts (each whole, its record last)."""

    def __init__(self, s: Setup, cfg: EmbedConfig, parts: list[Part]) -> None:
        self.s, self.cfg, self.parts = s, cfg, parts
        self.kind = s.encoder.data_kind
        self.current = -1
        self.writer: PartWriter | None = None
        self.meta: dict[str, Any] = {}
        self.offset = 0

    def _next(self, dim: int) -> None:
        self.current += 1
        part = self.parts[self.current]
        self.meta = metadata_columns(self.s.items[part.start : part.stop], self.kind)
        schema = item_schema(self.kind, self.cfg.prefix, dim)
        self.writer, self.offset = PartWriter(Path(self.cfg.out), part, schema), 0

    def write(self, x: np.ndarray) -> None:
        """One batch's embeddings (a batch never spans two parts: ``items.parts_loader``)."""
        if self.writer is None:
            self._next(x.shape[1])
        assert self.writer is not None
        part = self.parts[self.current]
        bad = np.flatnonzero(~np.isfinite(x).all(axis=1))
        if len(bad):
            raise DataError(
                f"item {part.start + self.offset + int(bad[0])} of the selection: a non-finite "
                "embedding (the checkpoint's weights or the item's pixels)"
            )
        rows = {k: v.slice(self.offset, len(x)) for k, v in self.meta.items()}
        self.writer.write(item_batch(self.kind, self.writer.schema, rows, x))
        self.offset += len(x)
        if self.offset == part.rows:
            self.writer.finish()
            self.writer = None

    def abort(self) -> None:
        """The part in progress leaves no file (finished parts stay); also when the interrupt
        came while its writer was being made, before it was ours to abort."""
        try:
            if self.writer is not None:
                self.writer.abort()
        finally:  # a second Ctrl-C in the writer's abort: this file still goes
            if 0 <= self.current < len(self.parts):
                temporary(Path(self.cfg.out), self.parts[self.current]).unlink(missing_ok=True)


def embed_mine(s: Setup, cfg: EmbedConfig, backend: Backend) -> dict[str, int]:
    """This process's parts: complete ones kept, the others embedded.

    The processes agree after every batch (``hosts.agree``, one host sum): a process waits in a
    collective for at most one batch of the slowest, never for its whole share (a share one
    part shorter, a host 20x slower), and a failure on one process (a field it cannot read)
    stops every process at the next batch with its message. A process whose share is done goes
    on agreeing, with nothing to do, until every process is done."""
    parts = mine(plan(len(s.items), cfg.part_size), backend.process_index, backend.process_count)
    todo = []
    for part in parts:
        record, why = check_part(Path(cfg.out), part)
        if record is None:
            if why != "not written":
                log.warning("%s: %s; embedding it again", part.name, why)
            todo.append(part)
    progress = Progress(sum(p.rows for p in todo), cfg.progress_s, backend.process_index)
    log.info(
        "embed (process %d of %d): %d parts of %d to embed (%d items), %d complete already",
        backend.process_index,
        backend.process_count,
        len(todo),
        len(parts),
        progress.total,
        len(parts) - len(todo),
    )
    s.encoder.module.to(backend.device)
    views = [s.items[p.start : p.stop] for p in todo]
    sink = PartSink(s, cfg, todo)
    workers = cfg.num_workers or 0  # resolved by run_embed (loader_workers)
    batches = iter(parts_loader(views, s.root, s.encoder, cfg.batch_size, workers))
    going = True
    try:
        while True:
            failure: OcttrainError | None = None
            if going:
                try:
                    failure = _one_batch(s, batches, sink, progress, backend)
                except StopIteration:
                    going = False
            if hosts.agree(backend, failure, "embedding its parts", going=going) == 0:
                break
    except BaseException:
        sink.abort()
        raise
    return {
        "parts_embedded": len(todo),
        "parts_kept": len(parts) - len(todo),
        "items_embedded": progress.done,
    }


def _one_batch(
    s: Setup, batches: Iterator[dict[str, Any]], sink: PartSink, progress: Progress, b: Backend
) -> OcttrainError | None:
    """The next batch embedded and written (StopIteration: none left); the failure, if any, to
    agree on. With peers, a failure of any class is theirs to learn too (its traceback logged
    here), not a crash that leaves them waiting."""
    try:
        x = embed_batch(s.encoder, next(batches), b)
        sink.write(x)
        progress.advance(len(x))
    except OcttrainError as exc:
        return exc
    except StopIteration:
        raise
    except Exception as exc:
        if b.process_count == 1:
            raise  # no peer to tell: the bug keeps its class and traceback
        log.error("embedding its parts failed:\n%s", traceback.format_exc())
        return OcttrainError(f"embedding its parts: {type(exc).__name__}: {exc}")
    return None


def finish(s: Setup, cfg: EmbedConfig) -> dict[str, Any]:
    """Process 0, every part written: the per-group table, then the header."""
    folder = Path(cfg.out)
    parts = plan(len(s.items), cfg.part_size)
    records = []
    for part in parts:
        record, why = check_part(folder, part)
        if record is None:
            raise DataError(f"{folder / part.name}: {why} after every process finished")
        records.append(vars(record))
    schema = pq.read_schema(folder / parts[0].name)
    dim = sum(1 for name in schema.names if name.startswith(cfg.prefix))
    groups = export.write_groups(folder, parts, s.encoder.data_kind, cfg.prefix, dim)
    header = {
        "format": export.FORMAT,
        "kind": s.encoder.data_kind,
        "created": _now(),
        "code_version": __version__,
        "identity": s.identity,
        "checkpoint": s.checkpoint,
        "config": s.encoder.config,
        "manifest": s.manifest,
        "split": cfg.split,
        "features": {"prefix": cfg.prefix, "dim": dim, "dtype": "float32"},
        "items": len(s.items),
        "parts": records,
        "groups": groups,
        "group_keys": list(GROUPS[s.encoder.data_kind][0]),
    }
    export.write_header(folder, header)
    return header


def totals(backend: Backend, mine: dict[str, Any], seconds: float) -> dict[str, float]:
    """Every process's counts summed; the rate over ``seconds``, measured after the agree that
    follows the slowest process (so the same on every process)."""
    keys = ("parts_embedded", "parts_kept", "items_embedded")
    counts = torch.tensor([float(mine[k]) for k in keys], dtype=torch.float64)
    if backend.process_count > 1:
        counts = backend.reduce_host_sum(counts)
    out = {k: int(v) for k, v in zip(keys, counts.tolist(), strict=True)}
    return {**out, "items_per_s": round(out["items_embedded"] / max(seconds, 1e-9), 2)}


def loader_workers(configured: int | None, kind: str) -> int:
    """``--num-workers``, else 0 on CPU (the forward's threads take the cores) and up to 8 on
    an accelerator (the host only reads and cuts the views)."""
    if configured is not None:
        return configured
    return 0 if kind == "cpu" else max(1, min(8, (os.cpu_count() or 2) - 1))


def run_embed(cfg: EmbedConfig) -> dict[str, Any]:
    """``octtrain embed``: the summary (what was embedded and kept, where the tables are)."""
    started = time.monotonic()
    backend = make_backend(resolve_kind(cfg.device, xla=False))
    workers = loader_workers(cfg.num_workers, backend.kind)
    cfg = dataclasses.replace(cfg, num_workers=workers)
    if backend.kind == "cpu":  # the cores left beside the loader workers (runtime/backend.py)
        torch.set_num_threads(cpu_threads(0, workers))
    try:
        url = hosts.agreed(backend, "finding the checkpoint", lambda: _locate(cfg, backend))
        url = backend.broadcast_object(url)
        s = hosts.agreed(backend, "setting up the export", lambda: setup(cfg, backend, url))
        agree_identity(backend, s)
        complete = bool(backend.broadcast_object(s.complete))
        summary: dict[str, Any] = {"out": cfg.out, "items": len(s.items)}
        if complete:
            log.info("%s: the export is complete; nothing to embed", cfg.out)
            kept = len(plan(len(s.items), cfg.part_size))
            summary |= {"parts_embedded": 0, "items_embedded": 0, "parts_kept": kept}
        else:
            mine_started = time.monotonic()
            summary |= embed_mine(s, cfg, backend)
            summary |= totals(backend, summary, time.monotonic() - mine_started)
            hosts.beating(
                backend, "writing the per-group table and the header", lambda: finish(s, cfg)
            )
        header = export.read_header(Path(cfg.out), check=False) if backend.is_main else {}
        summary |= {
            "header": str(Path(cfg.out) / export.HEADER),
            "groups": header.get("groups", {}),
            "parts": len(header.get("parts", [])),
            "seconds": round(time.monotonic() - started, 1),
        }
        return summary
    finally:
        backend.close()
