"""``octstage stage SRC DST``: pull a built cache and its manifest to local SSD, verified.

SRC is any location (``gs://bucket/cache``, ``s3://...``, ``b2://...``, an rclone remote or a
folder) holding ``manifest.json`` and the ``volumes/`` it names (a Cell Painting manifest:
the ``fields/``; everything below applies to either kind). Nothing is listed: the manifest
names every volume, and each volume's own Zarr metadata names its objects (group ``zarr.json``,
array ``0/zarr.json``, and the shards: zarr opens the fetched metadata and names them with the
array's own chunk grid and chunk key encoding). Every name is checked
(``octstage.storage.check_name``), and a manifest naming ``..`` or an absolute path, or a
``zarr_path`` the manifest schema's pattern refuses, is refused as a whole before anything is
fetched.

A packed Cell Painting cache (``build-cache --pack``) is staged a pack at a time: its two
objects (``0/zarr.json``, the shard), then each member field's checksum (the manifest's rows of
that pack, one field's values in memory at a time: ``packstore.check_pack``). At most
``4 x transfers`` volumes or packs are submitted ahead of the one reported.

Volumes are fetched in parallel, each into a hidden temporary folder that is renamed into place,
then checked against the manifest checksum (``octstage.cache.volumestore.check_volume``). A volume
already in DST that passes the check is skipped, so a killed stage resumes where it stopped.
The manifest is written last, and only when every volume verified: a folder with a manifest is
complete, and the trainer needs nothing but it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from array import array
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import zarr
from rich.console import Console
from rich.table import Table
from zarr.storage import LocalStore

from octstage import manifest as manifest_mod
from octstage.cache.volumestore import check_volume
from octstage.cellpainting import packstore
from octstage.errors import (
    ManifestError,
    MirrorError,
    OctstageError,
    StorageError,
    VerificationError,
)
from octstage.manifest import atomic_write_bytes, atomic_write_text
from octstage.progress import counter, interval, megabytes
from octstage.stage.destination import (
    check_destination,
    clear_manifest,
    finish_replace,
    record_replaced,
    replaced_paths,
    sweep_replaced,
)
from octstage.storage import Storage, check_name, open_location
from octstage.storage.locations import known_secrets, parse_location, scrub

log = logging.getLogger(__name__)
MANIFEST = "manifest.json"
MAX_SHARDS = 100_000  # per volume; a larger grid means hostile or broken metadata
COPY_BUFFER = 8 * 1024 * 1024


@dataclass
class StageReport:
    source: str
    destination: str
    volumes: int = 0
    downloaded: int = 0
    present: int = 0
    failed: list[dict[str, str]] = field(default_factory=list)
    bytes: int = 0
    seconds: float = 0.0
    manifest_written: bool = False
    removed: int = 0  # files of a replaced cache that the new manifest does not name
    kept: list[str] = field(default_factory=list)  # found beside a replaced cache, not its own
    exit_code: int = 0


def shard_keys(array_dir: Path) -> list[str]:
    """Store keys of every stored chunk (shard) of the Zarr array whose ``zarr.json`` is in
    ``array_dir``, as zarr itself names them (its chunk grid and chunk key encoding)."""
    try:
        array = zarr.open_array(store=LocalStore(array_dir, read_only=True), mode="r")
        meta = array.metadata
        count = meta.chunk_grid.get_nchunks(array.shape)
    except (ValueError, TypeError, KeyError, NotImplementedError, OSError) as exc:
        raise VerificationError(f"unreadable array metadata: {type(exc).__name__}: {exc}") from None
    if count > MAX_SHARDS:
        raise VerificationError(f"{count} chunks in one volume: refusing")
    return [meta.encode_chunk_key(c) for c in meta.chunk_grid.all_chunk_coords(array.shape)]


@functools.cache
def zarr_path_pattern(kind: str = "oct") -> re.Pattern[str]:
    """The manifest schema's own pattern for an item's ``zarr_path`` (one source of truth):
    a volume's (OCT) or a field's (Cell Painting)."""
    schema = json.loads(manifest_mod.SCHEMA_PATH.read_text())
    item = "field" if kind == "cellpainting" else "volume"
    return re.compile(schema["$defs"][item]["properties"]["zarr_path"]["pattern"])


def volume_paths(manifest: manifest_mod.Manifest, where: str) -> dict[str, str | array[int]]:
    """``{zarr_path: checksum}`` of every volume (a packed field's: ``{zarr_path: rows}``,
    the manifest's rows of the pack's members), or an error naming the manifest and the entry:
    a name that could escape the destination (UnsafePathError) or that the schema would refuse
    (ManifestError). Either refuses the whole manifest before anything is fetched. An item
    table is read a row group at a time (three columns, no item built): a million fields'
    paths and checksums as Python strings were ~250 MB; a pack's rows are 8 bytes each."""
    volumes: dict[str, str | array[int]] = {}
    pattern = zarr_path_pattern(manifest.kind)
    key = "fields" if manifest.kind == "cellpainting" else "volumes"
    last: str | None = None  # a pack's members come one after another: its name checked once
    for n, (path, checksum, slot) in enumerate(_address_rows(manifest.items, key)):
        if path != last:
            rel = check_name(path)
            # fullmatch: the schema's "$" (ECMA-262) does not allow the trailing newline re's does.
            if not pattern.fullmatch(rel):
                raise ManifestError(
                    f"{where}: {key}[{n}].zarr_path {rel!r} does not match the schema's pattern "
                    f"{pattern.pattern!r}: refusing the manifest, nothing fetched"
                )
            last = path
        listed = volumes.setdefault(rel, checksum if slot is None else array("q"))
        if isinstance(listed, array) != (slot is not None):
            raise ManifestError(f"{where}: {rel}: listed both as one field and as a pack")
        if isinstance(listed, array):
            listed.append(n)
        elif listed != checksum:
            raise VerificationError(f"{where}: {rel}: listed twice with different checksums")
    return volumes


def _address_rows(items: Sequence[Any], key: str) -> Iterator[tuple[str, str, int | None]]:
    """Each item's ``(zarr_path, checksum, pack_index)``: of an item table, a row group at a
    time (nothing kept); of a list, the items' own."""
    if not isinstance(items, manifest_mod.ItemTable):
        for v in items:
            yield v.zarr_path, v.checksum, getattr(v, "pack_index", None)
        return
    names = ("zarr_path", "checksum") + (("pack_index",) if key == "fields" else ())
    for batch in items.batches(names):
        columns = [batch.column(n).to_pylist() for n in names]
        slots = columns[2] if len(columns) == 3 else [None] * batch.num_rows
        yield from zip(columns[0], columns[1], slots, strict=True)


def pack_members(items: Sequence[Any], rows: Sequence[int]) -> list[packstore.Member]:
    """The pack members' ``(pack_index, shape, checksum)`` at the manifest's ``rows``."""
    if isinstance(items, manifest_mod.ItemTable):
        view = items.take(list(rows))
        columns = [view.column(c, keep=False) for c in ("pack_index", "shape", "checksum")]
        return [(int(i), tuple(s), str(c)) for i, s, c in zip(*columns, strict=True)]
    return [(int(items[n].pack_index), tuple(items[n].shape), items[n].checksum) for n in rows]


def _read_table(storage: Storage, data: Any, secrets: list[str]) -> tuple[str, bytes] | None:
    """The columnar form's item table ``(name, bytes)``, fetched and checked against the
    header's SHA-256 (a table of another build is refused before any byte moves); None when the
    manifest is the JSON form."""
    info = data.get("table") if isinstance(data, dict) else None
    if info is None:
        return None
    where = f"{storage.url}/{MANIFEST}"
    name = manifest_mod.table_file_name(info, where)
    try:
        body = storage.read_bytes(check_name(name))
    except StorageError as exc:
        raise StorageError(
            scrub(f"cannot read the manifest's item table: {exc}", secrets)
        ) from None
    digest = hashlib.sha256(body).hexdigest()
    if digest != info.get("sha256"):
        raise ManifestError(
            f"{where}: item table {name} has SHA-256 {digest}, the header says "
            f"{info.get('sha256')}: a table of another build; rebuild or re-upload the cache"
        )
    return name, body


class _Abandoned(Exception):
    """A volume given up because the run was interrupted; it never leaves its worker's future
    (the pool is shut down on Ctrl-C and nobody reads that future)."""


def _fetch(storage: Storage, name: str, path: Path, cancel: threading.Event) -> int:
    """Stream one object to ``path``; returns its size. Stops between buffers once ``cancel``
    is set, so Ctrl-C does not wait for a 200 MB shard to arrive."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with storage.open(name) as src, open(path, "wb") as out:
        while block := src.read(COPY_BUFFER):
            if cancel.is_set():
                raise _Abandoned(name)
            out.write(block)
        out.flush()
        os.fsync(out.fileno())
        return out.tell()


def _write(path: Path, data: bytes) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    return len(data)


def _check(dst: Path, relpath: str, checksum: str | list[packstore.Member]) -> None:
    """check_volume (a pack: ``packstore.check_pack``), with damaged bytes (which zarr's codecs
    reject) as a VerificationError."""
    try:
        if isinstance(checksum, list):
            packstore.check_pack(dst, relpath, checksum)
        else:
            check_volume(dst, relpath, checksum)
    except VerificationError:
        raise
    except (ValueError, RuntimeError, OSError, KeyError, TypeError) as exc:
        raise VerificationError(f"{relpath}: unreadable: {type(exc).__name__}: {exc}") from None


def stage_volume(
    storage: Storage,
    dst: Path,
    relpath: str,
    checksum: str | list[packstore.Member],
    cancel: threading.Event,
) -> tuple[str, int]:
    """Fetch and verify one volume (or pack of fields: ``checksum`` lists its members):
    ("present" | "downloaded", bytes fetched). Once ``cancel`` is set (Ctrl-C) a volume in
    flight is abandoned, its temporary folder removed, and nothing is renamed into place: an
    interrupted run adds no volume its reader did not see finish."""
    final = dst / relpath
    packed = isinstance(checksum, list)
    for stale in final.parent.glob(f".stage-{final.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)  # left by a killed run
    if (final / "0" / "zarr.json").is_file():
        try:
            _check(dst, relpath, checksum)
            return "present", 0
        except VerificationError:
            log.info("%s: present but does not verify; fetching it again", relpath)
    tmp = final.parent / f".stage-{final.name}-{uuid.uuid4().hex[:8]}"
    fetched = 0
    skipped: list[str] = []
    try:
        # small: one request each, no streaming (a pack has no group metadata)
        for name in ("0/zarr.json",) if packed else ("zarr.json", "0/zarr.json"):
            fetched += _write(tmp / name, storage.read_bytes(f"{relpath}/{name}"))
        for key in shard_keys(tmp / "0"):
            name = check_name(f"{relpath}/0/{key}")
            try:
                fetched += _fetch(storage, name, tmp / "0" / key, cancel)
            except StorageError as exc:
                # Zarr stores no object for an all-fill chunk; the checksum below decides.
                skipped.append(str(exc))
        if cancel.is_set():
            raise _Abandoned(relpath)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    try:
        _check(dst, relpath, checksum)
    except VerificationError as exc:
        shutil.rmtree(final, ignore_errors=True)
        detail = f"{exc}" + (f" (not fetched: {'; '.join(skipped)[:300]})" if skipped else "")
        raise VerificationError(detail) from None
    return "downloaded", fetched


def _submitted(
    pool: ThreadPoolExecutor,
    storage: Storage,
    dst: Path,
    volumes: dict[str, str | array[int]],
    items: Sequence[Any],
    transfers: int,
    cancel: threading.Event,
) -> Iterator[tuple[str, Future[tuple[str, int]]]]:
    """Each volume's (or pack's) staging, submitted at most ``4 * transfers`` ahead of the one
    reported (a future per item of a million-item cache at once held their results and
    arguments all together); a pack's members are looked up when it is submitted."""
    pending: deque[tuple[str, Future[tuple[str, int]]]] = deque()
    for rel, what in volumes.items():
        if len(pending) >= 4 * max(1, transfers):
            yield pending.popleft()
        check = pack_members(items, what) if isinstance(what, array) else what
        pending.append((rel, pool.submit(stage_volume, storage, dst, rel, check, cancel)))
    while pending:
        yield pending.popleft()


def run_stage(
    src: str,
    dst: Path,
    *,
    transfers: int = 16,
    json_out: Path | None = None,
    progress_seconds: float | None = None,
    replace: bool = False,
) -> int:
    """Stage the cache at ``src`` into the local folder ``dst``; returns the exit code.
    Progress is a bar on a terminal, else a plain line every ``progress_seconds``. A ``dst``
    holding another cache is refused unless ``replace`` (see ``octstage.stage.destination``)."""
    started = time.monotonic()
    every = interval(progress_seconds)  # checked before any work starts
    loc = parse_location(src)
    secrets = known_secrets([loc])
    storage = open_location(loc)
    report = StageReport(storage.url, str(dst))
    try:
        raw = storage.read_bytes(MANIFEST)
    except StorageError as exc:
        raise StorageError(scrub(f"cannot read the manifest: {exc}", secrets)) from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{storage.url}/{MANIFEST}: not JSON: {exc}") from None
    table = _read_table(storage, data, secrets)  # the columnar form's items; None for JSON
    parsed = manifest_mod.from_dict(
        data, source=f"{storage.url}/{MANIFEST}", table=None if table is None else table[1]
    )
    volumes = volume_paths(parsed, f"{storage.url}/{MANIFEST}")  # unsafe names first
    # The one check of a manifest: a contradictory or empty one is refused before any byte moves.
    manifest_mod.refuse(parsed, f"{storage.url}/{MANIFEST}", "stage", ManifestError)
    if isinstance(parsed.items, manifest_mod.ItemTable):  # the checks' columns: ~0.2 KB a field
        parsed.items.release(kept=True)
    report.volumes = len(volumes)
    replacing = check_destination(dst, raw, replace)
    if replacing:
        record_replaced(dst, _listed_by_old(dst, raw))
        clear_manifest(dst)
    dst.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True)
    cancel = threading.Event()
    with (
        counter(console, "stage", len(volumes), every) as advance,
        ThreadPoolExecutor(max_workers=max(1, transfers)) as pool,
    ):
        submitted = _submitted(pool, storage, dst, volumes, parsed.items, transfers, cancel)
        try:
            for rel, future in submitted:
                try:
                    status, nbytes = future.result()
                except (OctstageError, OSError, ValueError) as exc:
                    report.failed.append({"volume": rel, "reason": scrub(str(exc), secrets)})
                else:
                    report.bytes += nbytes
                    report.present += status == "present"
                    report.downloaded += status == "downloaded"
                advance(
                    f"{report.downloaded} downloaded, {report.present} present, "
                    f"{len(report.failed)} failed, {megabytes(report.bytes)}"
                )
        except KeyboardInterrupt:
            # Volumes not started are dropped, the running ones abandoned at their next buffer
            # (their temporary folders removed), so the interrupt is not held up by the rest.
            cancel.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    if not report.failed:
        if replacing:
            report.removed, report.kept = sweep_replaced(dst, volumes, replaced_paths(dst))
        if table is not None:  # the items before the header that names them
            atomic_write_bytes(dst / table[0], table[1])
        atomic_write_text(dst / MANIFEST, raw.decode("utf-8"))
        report.manifest_written = True
        if replacing:
            finish_replace(dst)
    report.exit_code = 1 if report.failed else 0
    report.seconds = round(time.monotonic() - started, 3)
    _print_summary(report, console)
    if json_out is not None:
        text = json.dumps({"command": "stage", **asdict(report)}, indent=1, ensure_ascii=False)
        atomic_write_text(json_out, text + "\n")
    return report.exit_code


def _listed_by_old(dst: Path, new: bytes) -> set[str]:
    """Every path the cache now in ``dst`` lists (its arrays and its item table), which a
    replace may remove; empty when its manifest is the new one or gone (an unfinished replace
    recorded them already). A manifest that cannot be read is refused: nothing is removed on a
    guess."""
    path = dst / MANIFEST
    if not path.is_file():
        return set()
    try:
        raw = path.read_bytes()
        if raw == new:
            return set()
        data = json.loads(raw)
        table = _read_table(open_location(parse_location(str(dst))), data, [])
        parsed = manifest_mod.from_dict(
            data, source=str(path), table=None if table is None else table[1]
        )
        listed = set(volume_paths(parsed, str(path)))
    except (OctstageError, ValueError, OSError) as exc:
        raise MirrorError(
            f"{path}: the manifest of the cache --replace would replace cannot be read ({exc}); "
            "only the files a readable manifest lists are ever removed, so nothing was changed: "
            "move the folder's contents away yourself, or choose an empty folder"
        ) from None
    return listed | ({table[0]} if table is not None else set())


def _print_summary(r: StageReport, console: Console) -> None:
    table = Table(title=f"octstage stage {r.source} -> {r.destination}")
    table.add_column("")
    table.add_column("volumes", justify="right")
    table.add_row("in the manifest", str(r.volumes))
    table.add_row("downloaded and verified", str(r.downloaded))
    table.add_row("already present and verified", str(r.present))
    table.add_row("failed", str(len(r.failed)))
    speed = r.bytes / r.seconds / 1e6 if r.seconds else 0.0
    table.add_row("bytes fetched", f"{r.bytes / 1e6:,.1f} MB ({speed:,.1f} MB/s)")
    if r.removed:
        table.add_row("files of the replaced cache removed", str(r.removed))
    if r.kept:
        table.add_row("found beside it, not a cache's: kept", str(len(r.kept)))
    table.add_row("manifest written", "yes" if r.manifest_written else "NO: re-run to finish")
    console.print(table)
    if r.kept:
        shown = ", ".join(r.kept[:10]) + (
            f" and {len(r.kept) - 10} more" if len(r.kept) > 10 else ""
        )
        console.print(f"  kept in place (neither cache lists them): {shown}", markup=False)
    for failure in r.failed[:20]:
        console.print(f"  failed: {failure['volume']}: {failure['reason']}", markup=False)
