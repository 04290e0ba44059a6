"""``octstage verify``: does the cache still hold exactly what the manifest says?

Recomputes every listed volume's checksum (and checks its shape and dtype), reports volumes that
are missing or changed, volume folders under ``CACHE/volumes`` the manifest does not list
(extra: a local walk of the cache, never a bucket listing), and validates the manifest against
the JSON Schema that ships with the package (``octstage/manifest.schema.json``: the header
with jsonschema, a columnar manifest's item rows on their typed columns, ``rowschema``, with
jsonschema wording the rows those refuse). Exit 0 clean, 1 problems, each one line: a volume
missing (its folder, its metadata or a data object that held values: zarr would silently read
fill values), changed (the bytes are there and differ: the
values' checksum, or the crc32c that caches written since it have after each chunk), extra,
a schema violation, or the manifest contradicting itself (``manifest.consistency_problems``).
A manifest whose values are not of the schema's types, or whose keys are missing, unknown or
given twice, does not load (``manifest.itemtypes``): those are its schema problems, and no item
is read.
A packed Cell Painting field (``pack_index``) is checked in its pack (``check_packed``: its
members' tiles read from the shard directly, ``packread``; a pack or member that does not read
cleanly there is opened through zarr once, its values read a run at a time); a pack whose shard
is gone makes every member missing. An item table's items are walked as their few columns
(``listed``), never as item dataclasses.
"""

from __future__ import annotations

import functools
import json
import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import numpy as np
import zarr
from rich.console import Console
from rich.table import Table

from octstage import manifest as mf
from octstage.bounded import bounded_map
from octstage.cache import volumestore
from octstage.cellpainting import packread, packstore
from octstage.errors import ManifestError, ManifestTypeError, VerificationError
from octstage.manifest import rowschema
from octstage.manifest.columnar import json_row
from octstage.progress import Advance, counter, interval

console = Console(stderr=True)
T = TypeVar("T")
ARRAY_FOLDERS = (".ome.zarr", ".pack.zarr")  # a volume's or field's group, a pack's folder
SCHEMA = mf.SCHEMA_PATH


@dataclass
class VerifyReport:
    """What ``verify`` found; ``ok`` only when every list of problems is empty."""

    manifest: str
    cache: str
    volumes: int = 0  # the manifest's items: volumes, or fields for kind "cellpainting"
    verified: int = 0
    missing: list[str] = field(default_factory=list)
    missing_why: dict[str, str] = field(default_factory=dict)  # zarr_path -> what is gone
    changed: list[dict[str, str]] = field(default_factory=list)  # zarr_path, why
    extra: list[str] = field(default_factory=list)
    schema_errors: list[str] = field(default_factory=list)
    inconsistent: list[str] = field(default_factory=list)  # the manifest contradicts itself
    schema: str = "skipped"  # "valid", "invalid" or "skipped: <why>"
    temporaries: list[str] = field(default_factory=list)  # leftovers of a killed build (harmless)
    kind: str = "oct"

    @property
    def ok(self) -> bool:
        return not (
            self.missing or self.changed or self.extra or self.schema_errors or self.inconsistent
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


Opener = Callable[[str], "zarr.Array[Any]"]


class Listed(NamedTuple):
    """What the value check reads of one item (an ``mf.Item``'s common part, or a table row's
    columns: no item dataclass is built per row of a columnar manifest)."""

    zarr_path: str
    shape: tuple[int, ...]
    dtype: str
    checksum: str
    pack_index: int | None


LISTED = Listed._fields


def listed(items: Sequence[mf.Item]) -> Iterator[Listed]:
    """The items' ``Listed`` parts in order: of an item table, its few columns a row group at a
    time (a million fields' dataclasses took minutes to build, twice)."""
    if not isinstance(items, mf.ItemTable):
        for item in items:
            index = getattr(item, "pack_index", None)
            yield Listed(item.zarr_path, tuple(item.shape), item.dtype, item.checksum, index)
        return
    names = [n for n in LISTED if n in items.names]  # an OCT table has no pack_index
    for batch in items.batches(names):
        columns = [batch.column(n).to_pylist() for n in names]
        if len(names) < len(LISTED):
            columns.append([None] * batch.num_rows)
        for path, shape, dtype, checksum, index in zip(*columns, strict=True):
            yield Listed(path, tuple(shape or ()), dtype, checksum, index)


Finding = tuple[str, str] | None


def check_packed(cache: Path, items: Sequence[Listed], opener: Opener) -> list[Finding]:
    """``check_entry`` for packed fields of one pack, one finding per item: its pack's metadata
    and shard there (else "missing"), its values (the chunks it covers alone) those the
    manifest says (else "changed"). Read from the shard directly (``packread``); a pack or
    member that path does not read cleanly is read through zarr: ``opener`` opens a pack once
    for all its members (``packstore.open_pack``), whose values are read in runs
    (``packstore.member_values``) and whose failures are worded."""
    relpath = items[0].zarr_path
    if not (cache / relpath).exists():
        return [("missing", "not in the cache")] * len(items)
    irregular = _irregular(cache, relpath)
    if irregular is not None:
        return [irregular] * len(items)
    members = [(_pack_index(item), tuple(item.shape), item.checksum) for item in items]
    direct = packread.fields(cache / relpath / "0", [(i, s) for i, s, _ in members])
    if direct is None:
        return _through_zarr(relpath, members, opener)
    findings: list[Finding] = []
    for n, values in enumerate(direct):
        if values is None:  # a tile zarr must read (empty, damaged): it words the finding
            findings.extend(_through_zarr(relpath, members[n : n + 1], opener))
            continue
        finding = packstore.values_finding(values, members[n])
        findings.append(None if finding is None else ("changed", finding))
    return findings


def _through_zarr(relpath: str, members: list[packstore.Member], opener: Opener) -> list[Finding]:
    """One finding per member, read through zarr."""
    try:
        pack = opener(relpath)
    except VerificationError as exc:
        return [("missing", str(exc).removeprefix(f"{relpath}: "))] * len(members)
    except Exception as exc:  # noqa: BLE001 - unreadable metadata is these items' finding
        return [("changed", f"unreadable: {type(exc).__name__}: {exc}")] * len(members)
    findings: list[Finding] = [None] * len(members)
    for n, values in packstore.member_values(pack, relpath, members):
        if isinstance(values, Exception):
            findings[n] = ("changed", _unreadable(values, members[n][0], relpath))
            continue
        finding = packstore.values_finding(values, members[n])
        findings[n] = None if finding is None else ("changed", finding)
    return findings


def _pack_index(item: Listed) -> int:
    assert item.pack_index is not None
    return int(item.pack_index)


def _unreadable(exc: Exception, index: int, relpath: str) -> str:
    """A packed field's read failure, in words (``member_values`` words a crc mismatch)."""
    if isinstance(exc, VerificationError):
        return str(exc).removeprefix(f"{relpath}: ")
    return f"field {index} unreadable: {type(exc).__name__}: {exc}"


def runs(items: Iterable[Listed], most: int) -> Iterator[list[Listed]]:
    """The items in manifest order, a packed pack's consecutive members together (at most
    ``most`` a run), every other item alone."""
    run: list[Listed] = []
    for item in items:
        packed = item.pack_index is not None
        if run and (not packed or item.zarr_path != run[0].zarr_path or len(run) >= most):
            yield run
            run = []
        if packed:
            run.append(item)
        else:
            yield [item]
    if run:
        yield run


def check_entry(cache: Path, volume: Listed) -> Finding:
    """``("missing"|"changed", why)`` for one volume (or Cell Painting field), None when it
    matches the manifest.

    "missing": the volume, its metadata or a data object that held values is gone (zarr would
    read the object as its fill value); "changed": the bytes are there and differ. An absent
    object whose values still match was all fill value (zarr never stored it): no finding.
    """
    if not (cache / volume.zarr_path).exists():
        return "missing", "not in the cache"
    irregular = _irregular(cache, volume.zarr_path)
    if irregular is not None:
        return irregular
    for meta in ("zarr.json", "0/zarr.json"):
        if not (cache / volume.zarr_path / meta).is_file():
            return "missing", f"{meta} gone"
    finding = _compare(cache, volume)
    if finding is None:
        return None
    try:
        absent = volumestore.absent_objects(cache, volume.zarr_path)
    except Exception:  # noqa: BLE001 - unreadable metadata: the comparison's finding stands
        absent = []
    if absent:
        shown = ", ".join(absent[:3]) + (f" and {len(absent) - 3} more" if len(absent) > 3 else "")
        return "missing", (
            f"data object(s) {shown} gone: zarr would read them as fill value ({finding})"
        )
    return "changed", finding


def _irregular(cache: Path, relpath: str) -> Finding:
    """A FIFO or device in the array folder: opening it would block verify for good."""
    try:
        volumestore.refuse_irregular(cache, relpath)
    except VerificationError as exc:
        return "missing", str(exc).removeprefix(f"{relpath}: ")
    return None


def _regular(path: Path) -> None:
    """ManifestError when ``path`` exists and is no regular file (reading a FIFO blocks)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return  # absent or unreadable: the load names it
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise ManifestError(
            f"{path}: not a regular file (a FIFO or device): not read; name the manifest file"
        )


def _compare(cache: Path, volume: Listed) -> str | None:
    """Why the stored values differ from the manifest's, or None when they match."""
    try:
        array = volumestore.read_volume(cache, volume.zarr_path)
    except Exception as exc:  # noqa: BLE001 - any read failure of this volume is its finding
        if volumestore.crc_mismatch(exc):
            return f"unreadable: {volumestore.CHANGED_BYTES}"
        return f"unreadable: {type(exc).__name__}: {exc}"
    if tuple(array.shape) != tuple(volume.shape) or str(array.dtype) != volume.dtype:
        return f"stored {array.dtype}{array.shape}, manifest {volume.dtype}{volume.shape}"
    actual = volumestore.array_checksum(array)
    if actual != volume.checksum:
        return f"checksum {actual} != manifest {volume.checksum}"
    return None


def volume_folders(cache: Path, top: str = "volumes") -> Iterator[tuple[str, bool]]:
    """``(relpath, hidden)`` of every ``<top>/<pid or plate>/<name>.ome.zarr`` folder in a local
    cache (``top``: ``volumes`` for OCT, ``fields`` for Cell Painting)."""
    root = cache / top
    if not root.is_dir():
        return
    for pid in sorted(p for p in root.iterdir() if p.is_dir()):
        for entry in sorted(pid.iterdir()):
            if entry.is_dir() and (
                entry.name.endswith(ARRAY_FOLDERS) or entry.name.startswith(".")
            ):
                yield entry.relative_to(cache).as_posix(), entry.name.startswith(".")


def validate_schema(data: Any, schema_path: Path = SCHEMA) -> tuple[str, list[str]]:
    """``(status, errors)``: the manifest JSON against the schema shipped with the package."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(json.loads(schema_path.read_text()))
    errors = [
        f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in validator.iter_errors(data)
    ]
    return ("invalid" if errors else "valid"), errors[:50]


def validate_table(
    manifest_path: Path,
    info: dict[str, Any],
    items: mf.ItemTable[Any],
    kind: str,
    advance: Advance = lambda detail="", count=1: None,
) -> list[str]:
    """The columnar form's item table: its SHA-256 against the header's, then every row against
    the schema's item definition, on the typed columns a batch at a time
    (``rowschema.suspects``: seconds at a million rows, where jsonschema row by row took twelve
    minutes) and with jsonschema on the suspect rows alone, which words each problem; one line
    per problem, naming the row and its item (``advance`` is called per batch, for progress)."""
    import jsonschema

    errors = []
    digest = mf.file_sha256(manifest_path.parent / info["path"])
    if digest != info["sha256"]:
        errors.append(
            f"table: {info['path']} has SHA-256 {digest}, the header says {info['sha256']}"
        )
    defs = json.loads(SCHEMA.read_text())["$defs"]
    item = "field" if kind == "cellpainting" else "volume"
    what = "fields" if kind == "cellpainting" else "volumes"
    name = "item_id" if kind == "cellpainting" else "zarr_path"  # what names an item to a user
    validator = jsonschema.Draft202012Validator({"$defs": defs, "$ref": f"#/$defs/{item}"})
    start = 0
    for batch in items.batches():
        for n in np.flatnonzero(rowschema.suspects(batch, defs[item], defs)):
            row = json_row(batch.slice(int(n), 1).to_pylist()[0])
            for e in validator.iter_errors(row):
                where = "/".join(str(p) for p in e.absolute_path)
                errors.append(
                    f"table/{what}/{start + n}{'/' + where if where else ''} "
                    f"({name} {row.get(name)!r}): {e.message}"
                )
        start += batch.num_rows
        advance(f"{len(errors)} problem(s)", batch.num_rows)
        if len(errors) >= 50:
            break
    return errors


def _interruptible(pool: ThreadPoolExecutor, results: Iterator[T]) -> Iterator[T]:
    """``results`` of ``pool.map``; on Ctrl-C the checks not started are dropped at once."""
    try:
        yield from results
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        raise


def verify(
    manifest_path: Path,
    cache: Path | None = None,
    threads: int | None = None,
    progress_seconds: float | None = None,
) -> VerifyReport:
    """Check every volume of the manifest against the cache (local folder). Progress is a bar
    on a terminal, else a plain line every ``progress_seconds``."""
    every = interval(progress_seconds)  # checked before any work starts
    for path in (manifest_path, manifest_path.with_name(manifest_path.stem + ".items.parquet")):
        _regular(path)
    root = cache if cache is not None else manifest_path.parent
    try:
        loaded = mf.load(manifest_path)
    except ManifestTypeError as exc:  # values the schema refuses: its problems, nothing compared
        return VerifyReport(
            str(manifest_path), str(root), schema="invalid", schema_errors=exc.problems[:50]
        )
    items = loaded.items  # OCT volumes or Cell Painting fields: the common part is enough
    report = VerifyReport(str(manifest_path), str(root), volumes=len(items), kind=loaded.kind)
    data = json.loads(manifest_path.read_text())
    report.schema, report.schema_errors = validate_schema(data)
    if isinstance(items, mf.ItemTable):  # the columnar form: its table's bytes and every row
        with counter(console, "schema of each row", len(items), every) as advance:
            table_errors = validate_table(manifest_path, data["table"], items, loaded.kind, advance)
        report.schema_errors = (report.schema_errors + table_errors)[:50]
        report.schema = "invalid" if report.schema_errors else report.schema
    report.inconsistent = mf.consistency_problems(loaded)
    # zarr's blosc and hashlib release the GIL on large buffers: threads give real parallelism.
    workers = threads or min(8, os.cpu_count() or 1)
    # A pack's members come one after the other: each pack is opened once (a few at a time).
    opener: Opener = functools.lru_cache(maxsize=4 * workers)(
        lambda rel: packstore.open_pack(root, rel)
    )

    def check(run: list[Listed]) -> list[tuple[Listed, Finding]]:
        if run[0].pack_index is None:
            return [(run[0], check_entry(root, run[0]))]
        return list(zip(run, check_packed(root, run, opener), strict=True))

    with (
        ThreadPoolExecutor(workers) as pool,
        counter(console, "verify", len(items), every) as advance,
    ):
        checked = _interruptible(
            pool,
            bounded_map(pool, check, runs(listed(items), packstore.DEFAULT_PACK), 4 * workers),
        )
        for volume, finding in (pair for run in checked for pair in run):
            if finding is None:
                report.verified += 1
            elif finding[0] == "missing":
                report.missing.append(volume.zarr_path)
                report.missing_why[volume.zarr_path] = finding[1]
            else:
                report.changed.append({"zarr_path": volume.zarr_path, "why": finding[1]})
            advance(
                f"{report.verified} verified, {len(report.missing)} missing, "
                f"{len(report.changed)} changed"
            )
    paths = (
        set(items.column("zarr_path"))  # one column, no item built
        if isinstance(items, mf.ItemTable)
        else {v.zarr_path for v in items}
    )
    tops = ("fields", packstore.PACKS) if loaded.kind == "cellpainting" else ("volumes",)
    for relpath, hidden in (f for top in tops for f in volume_folders(root, top)):
        if hidden:
            report.temporaries.append(relpath)
        elif relpath not in paths:
            report.extra.append(relpath)
    return report


def run_verify(
    manifest: Path,
    cache: Path | None = None,
    json_out: bool = False,
    progress_seconds: float | None = None,
) -> int:
    """CLI: print the report (a table, or JSON on stdout); exit 0 clean, 1 problems."""
    report = verify(manifest, cache, progress_seconds=progress_seconds)
    if json_out:
        sys.stdout.write(json.dumps(report.as_dict(), indent=1) + "\n")
    else:
        _print(report)
    return 0 if report.ok else 1


def extra_way_out(report: VerifyReport) -> str:
    """What extra arrays are and how to be rid of them: a rebuild removes the arrays it
    replaced (``cache.stale``) but keeps those of items it left out, so that a re-run reuses
    them, and an older build removed none; nothing reads them, but they take space and make
    verify report problems."""
    items = "fields" if report.kind == "cellpainting" else "volumes"
    return (
        f"extra: {len(report.extra)} {items} the manifest does not list, most likely of an earlier "
        "build: items this build left out (build-cache keeps them so a re-run that takes them "
        "back reuses them), or arrays a build before this version replaced without removing "
        "them; no command reads them. To drop them, copy "
        f"the cache without them (`octstage stage {report.cache} NEW_FOLDER` copies only what "
        "the manifest lists) or delete the folders named above"
    )


def _print(report: VerifyReport) -> None:
    table = Table(title=f"verify {report.manifest}", show_header=False)
    table.add_row("cache", report.cache)
    items = "fields" if report.kind == "cellpainting" else "volumes"
    table.add_row(items, str(report.volumes))
    table.add_row("verified", str(report.verified))
    table.add_row("missing", str(len(report.missing)))
    table.add_row("changed", str(len(report.changed)))
    table.add_row("extra (not in manifest)", str(len(report.extra)))
    table.add_row("schema", report.schema)
    if report.temporaries:
        table.add_row("temporaries (killed build)", str(len(report.temporaries)))
    if report.inconsistent:
        table.add_row("manifest contradictions", str(len(report.inconsistent)))
    console.print(table)
    lines = [
        *(f"missing {p}: {report.missing_why.get(p, 'not in the cache')}" for p in report.missing),
        *(f"changed {item['zarr_path']}: {item['why']}" for item in report.changed),
        *(f"extra {p}: a {items[:-1]} folder the manifest does not list" for p in report.extra),
        *(f"schema {err}" for err in report.schema_errors),
        *(f"manifest {report.manifest}: {why}" for why in report.inconsistent),
    ]
    for line in lines[:50]:
        console.print(line, markup=False, highlight=False)
    if len(lines) > 50:
        console.print(f"... {len(lines) - 50} more problems (--json lists them all)")
    if report.extra:
        console.print(extra_way_out(report), markup=False, highlight=False)
    console.print("[green]OK" if report.ok else "[red]PROBLEMS")
