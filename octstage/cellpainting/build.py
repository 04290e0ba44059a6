"""``octstage build-cache --kind cellpainting``: JUMP load-data tables -> verified uint8 fields.

For each plate of the load-data tables: every field's five channel TIFFs (and the plate's
illumination functions) are read once through the storage layer (``octstage.storage``: a folder,
``gs://``, ``s3://``...) and SHA1-hashed as read (S3 lists no SHA1: this is the "hashed once at
the source" of mirror's ``--hash-missing``; the manifest records each file's SHA1 and size);
decoded and checked (``normalize.decode_tiff``); divided by the illumination function; sampled
for the plate's robust percentiles per channel; kept in a scratch folder beside the cache. Then
each field is normalized with its plate's percentiles and written as one OME-Zarr field
(``fieldstore``). Fields are read by a local thread pool (``--workers`` threads: the work is
network reads and C decoders that release the GIL; the dask runner of the OCT build is not
needed at this size), plate after plate.

Failures keep their meaning:
- a data fault (a TIFF that does not decode, a channel of another shape, an illumination function
  that does not fit, a listed file absent at the source) rejects the field, with the reason, in
  the manifest's ``rejected``: deterministic, the same on every run (exit 1);
- an environment fault (a TLS error such as ``[SSL: WRONG_VERSION_NUMBER]``, a reset connection,
  any other storage or OS error while reading) is retried ``retries`` times in the run; if it
  persists, the plate is left out of this run's manifest (a plate's percentiles need all its
  fields) and is never called a bad file; exit 3: the same command again retries it. Fields
  already written are kept (the cache key names their content) and not written again.

Splits are by plate (``plate_splits``): the plates in a fixed pseudo-random order (SHA1 of the
plate name), the first ``round(val_share * n)`` (at least 1 when n >= 2) to val, the next
``round(test_share * n)`` (at least 1 when n >= 3) to test, the rest to train: no plate is in two
splits. The manifest is written last, atomically.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from rich.console import Console

from octstage import manifest as mf
from octstage.cellpainting import layout
from octstage.cellpainting.fieldstore import field_relpath, write_field
from octstage.cellpainting.normalize import (
    correct,
    decode_illum,
    decode_tiff,
    plate_normalization,
    sample,
    to_uint8,
)
from octstage.errors import CellPaintingError, ConfigError, ObjectNotFoundError, StorageError
from octstage.provenance import code_version
from octstage.storage import Storage, open_storage

console = Console(stderr=True)
T = TypeVar("T")
ENVIRONMENT = "environment"


@dataclass(frozen=True)
class CellPaintingConfig:
    """Every parameter that changes a cached field (all go into the cache key)."""

    p_low: float = 0.1
    p_high: float = 99.9
    chunk: int = 64
    clevel: int = 3
    illum: bool = True  # divide by the plate's illumination functions when the table names them
    val_share: float = 0.25
    test_share: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.p_low < self.p_high <= 100:
            raise ConfigError(
                f"percentiles p_low={self.p_low}, p_high={self.p_high}: need 0<=low<high<=100"
            )
        if self.chunk < 8:
            raise ConfigError(f"chunk {self.chunk}: must be at least 8 pixels")
        if not (0 <= self.val_share < 1 and 0 <= self.test_share < 1):
            raise ConfigError("val_share and test_share must lie in [0, 1)")


class EnvironmentFault(Exception):
    """Reading failed for a reason of the machine or the network (retry, never reject)."""


@dataclass
class BuildReport:
    """What the build did (printed, and written with ``json_out``)."""

    fields: int = 0
    written: int = 0
    kept: int = 0
    plates: int = 0
    rejected: list[dict[str, str]] = field(default_factory=list)
    environment: list[dict[str, str]] = field(default_factory=list)  # retry these: exit 3
    plates_left_out: list[str] = field(default_factory=list)
    seconds: float = 0.0


def plate_splits(plates: Sequence[str], val_share: float, test_share: float) -> dict[str, str]:
    """plate -> split (the rule in the module docstring)."""
    order = sorted(set(plates), key=lambda p: hashlib.sha1(p.encode()).hexdigest())
    n = len(order)
    n_val = max(1 if n >= 2 else 0, round(val_share * n))
    n_test = max(1 if n >= 3 and test_share > 0 else 0, round(test_share * n))
    n_val = min(n_val, max(0, n - 1))
    n_test = min(n_test, max(0, n - 1 - n_val))
    return {
        p: "val" if i < n_val else "test" if i < n_val + n_test else "train"
        for i, p in enumerate(order)
    }


def _read(storage: Storage, name: str, retries: int) -> bytes:
    """The object's bytes; CellPaintingError if it is absent, EnvironmentFault if reading kept
    failing (TLS, reset, timeouts, I/O: StorageError or OSError, ``ssl.SSLError`` included)."""
    for attempt in range(retries + 1):
        try:
            return storage.read_bytes(name)
        except ObjectNotFoundError:
            raise CellPaintingError(
                f"{name}: listed in the load-data table, absent at the source"
            ) from None
        except (StorageError, OSError) as exc:
            if attempt == retries:
                raise EnvironmentFault(f"{name}: {type(exc).__name__}: {exc}") from None
            time.sleep(0.2 * 2**attempt)
    raise AssertionError("unreachable")


def _table(url: str) -> tuple[str, bytes]:
    """A table given as a local path or URL: (name, bytes)."""
    parent, _, name = url.rstrip("/").rpartition("/")
    return url, open_storage(parent or ".").read_bytes(name)


def find_tables(storage: Storage) -> list[str]:
    """The load-data tables under ``workspace/load_data_csv/`` (one per plate folder, preferring
    ``load_data_with_illum.parquet``, then ``.csv``, then ``load_data.csv``)."""
    best: dict[str, str] = {}
    for info in storage.list(layout.LOAD_DATA_ROOT):
        folder, _, base = info.name.rpartition("/")
        if base in layout.LOAD_DATA_NAMES:
            rank = layout.LOAD_DATA_NAMES.index(base)
            if folder not in best or rank < layout.LOAD_DATA_NAMES.index(
                best[folder].rpartition("/")[2]
            ):
                best[folder] = info.name
    return [best[k] for k in sorted(best)]


@dataclass
class _Read:
    """One field after pass 1."""

    row: layout.FieldRow
    sources: tuple[mf.ChannelSource, ...] = ()
    scratch: Path | None = None
    dtype: str = ""
    sample: np.ndarray | None = None
    rejected: str = ""
    environment: str = ""


def _read_field(
    storage: Storage,
    row: layout.FieldRow,
    illum: dict[str, np.ndarray] | None,
    scratch: Path,
    retries: int,
) -> _Read:
    out = _Read(row)
    try:
        planes, sources = [], []
        for channel, name in row.images:
            data = _read(storage, name, retries)
            sources.append(
                mf.ChannelSource(channel, name, hashlib.sha1(data).hexdigest(), len(data))
            )
            planes.append(decode_tiff(data, name))
        shapes = {p.shape for p in planes}
        if len(shapes) != 1:
            raise CellPaintingError(f"{row.item_id}: channels differ in shape: {sorted(shapes)}")
        dtypes = {str(p.dtype) for p in planes}
        corrected = np.stack(
            [
                correct(p, None if illum is None else illum[c], name)
                for (c, name), p in zip(row.images, planes, strict=True)
            ]
        )
        out.sources, out.dtype = tuple(sources), "/".join(sorted(dtypes))
        out.sample = sample(corrected)
        out.scratch = scratch / f"{uuid.uuid4().hex}.npy"
        np.save(out.scratch, corrected)
    except CellPaintingError as exc:
        out.rejected = str(exc)
    except EnvironmentFault as exc:
        out.environment = str(exc)
    return out


def _cache_key(
    read: _Read,
    illum: tuple[mf.ChannelSource, ...],
    norms: tuple[mf.Normalization, ...],
    config: CellPaintingConfig,
) -> str:
    payload = {
        "sources": [s.sha1 for s in read.sources],
        "illum": [s.sha1 for s in illum],
        "normalization": [asdict(n) for n in norms],
        "config": asdict(config),
        "cache_version": mf.CACHE_VERSION,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


def _plate_illum(
    storage: Storage, rows: list[layout.FieldRow], retries: int
) -> tuple[dict[str, np.ndarray] | None, tuple[mf.ChannelSource, ...]]:
    """The plate's illumination functions (the first row's names; JUMP lists one per plate)."""
    if not rows[0].illum:
        return None, ()
    arrays: dict[str, np.ndarray] = {}
    sources = []
    for channel, name in rows[0].illum:
        data = _read(storage, name, retries)
        sources.append(mf.ChannelSource(channel, name, hashlib.sha1(data).hexdigest(), len(data)))
        arrays[channel] = decode_illum(data, name)
    return arrays, tuple(sources)


def build_plate(
    storage: Storage,
    rows: list[layout.FieldRow],
    out: Path,
    split: str,
    perturbations: dict[tuple[str, str], layout.Perturbation],
    config: CellPaintingConfig,
    workers: int,
    retries: int,
    report: BuildReport,
) -> list[tuple[mf.Field, str]]:
    """Pass 1 and 2 for one plate: its fields (label filled in later) or [] when left out."""
    plate = rows[0].plate
    scratch = out / f".scratch-{uuid.uuid4().hex[:8]}"
    scratch.mkdir(parents=True)
    try:
        try:
            illum, illum_sources = (
                _plate_illum(storage, rows, retries) if config.illum else (None, ())
            )
        except EnvironmentFault as exc:
            report.environment.append({"source": plate, "reason": f"{ENVIRONMENT}: {exc}"})
            report.plates_left_out.append(plate)
            return []
        except CellPaintingError as exc:
            report.rejected.extend({"source": r.item_id, "reason": str(exc)} for r in rows)
            return []
        with ThreadPoolExecutor(max(1, workers)) as pool:
            reads = list(pool.map(lambda r: _read_field(storage, r, illum, scratch, retries), rows))
        for r in reads:
            if r.rejected:
                report.rejected.append({"source": r.row.item_id, "reason": r.rejected})
            if r.environment:
                report.environment.append(
                    {"source": r.row.item_id, "reason": f"{ENVIRONMENT}: {r.environment}"}
                )
        good = [r for r in reads if not (r.rejected or r.environment)]
        if any(r.environment for r in reads):
            report.plates_left_out.append(plate)
            return []
        if not good:
            return []
        norms = plate_normalization(
            [r.sample for r in good if r.sample is not None], config.p_low, config.p_high
        )
        fields = []
        for r in good:
            assert r.scratch is not None
            array = to_uint8(np.load(r.scratch), norms)
            key = _cache_key(r, illum_sources, norms, config)
            rel = field_relpath(plate, key)
            existed = (out / rel / "0" / "zarr.json").is_file()
            channels = tuple(c for c, _ in r.row.images)
            checksum = write_field(
                out, rel, array, channels, {"item_id": r.row.item_id}, config.chunk, config.clevel
            )
            report.kept += existed
            report.written += not existed
            pert = perturbations.get((plate, r.row.well))
            fields.append(
                (
                    mf.Field(
                        item_id=r.row.item_id,
                        split=split,
                        label=None,
                        zarr_path=rel,
                        shape=(array.shape[0], array.shape[1], array.shape[2]),
                        dtype="uint8",
                        checksum=checksum,
                        cache_key=key,
                        sources=r.sources,
                        source=r.row.source,
                        batch=r.row.batch,
                        plate=plate,
                        well=r.row.well,
                        site=r.row.site,
                        channels=channels,
                        perturbation=pert.perturbation if pert else "",
                        perturbation_type=pert.perturbation_type if pert else "",
                        is_control=bool(pert and pert.is_control),
                        normalization=norms,
                        illum=illum_sources,
                        source_dtype=r.dtype,
                    ),
                    pert.perturbation if pert else "",
                )
            )
        return fields
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def build(
    source: str | Storage,
    out: Path,
    load_data: Sequence[str] = (),
    metadata: str | None = None,
    config: CellPaintingConfig | None = None,
    workers: int = 8,
    retries: int = 2,
    manifest_path: Path | None = None,
) -> tuple[BuildReport, mf.Manifest]:
    """Build the cache under ``out`` from the source root ``source`` (a URL or a Storage)."""
    started = time.monotonic()
    config = config or CellPaintingConfig()
    storage = open_storage(source) if isinstance(source, str) else source
    names = list(load_data) or find_tables(storage)
    if not names:
        raise CellPaintingError(
            f"{storage.url}: no load-data table under {layout.LOAD_DATA_ROOT} (give --load-data)"
        )
    rows: list[layout.FieldRow] = []
    for name in names:
        # A bare name is under the source root; a path or URL is read where it is.
        where, data = (
            _table(name)
            if ("://" in name or Path(name).is_absolute())
            else (name, storage.read_bytes(name))
        )
        rows += layout.parse_load_data(layout.read_table(data, where), where, storage.url)
    ids = [r.item_id for r in rows]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise CellPaintingError(f"field {dup} is listed twice in the load-data tables")
    perturbations: dict[tuple[str, str], layout.Perturbation] = {}
    if metadata:
        where, data = (
            _table(metadata)
            if ("://" in metadata or Path(metadata).exists())
            else (metadata, storage.read_bytes(metadata))
        )
        perturbations = layout.parse_perturbations(layout.read_table(data, where), where)
    by_plate: dict[str, list[layout.FieldRow]] = {}
    for r in rows:
        by_plate.setdefault(r.plate, []).append(r)
    splits = plate_splits(list(by_plate), config.val_share, config.test_share)
    report = BuildReport(fields=len(rows), plates=len(by_plate))
    out.mkdir(parents=True, exist_ok=True)
    built: list[tuple[mf.Field, str]] = []
    for plate in sorted(by_plate):
        built += build_plate(
            storage,
            by_plate[plate],
            out,
            splits[plate],
            perturbations,
            config,
            workers,
            retries,
            report,
        )
        console.print(f"plate {plate}: {len(by_plate[plate])} fields read ({splits[plate]})")
    classes = tuple(sorted({p for _, p in built if p}))
    fields = tuple(
        mf.Field(**{**f.__dict__, "label": classes.index(p) if p else None}) for f, p in built
    )
    rejected = tuple(mf.Rejected(r["source"], r["reason"]) for r in report.rejected)
    config_dict: dict[str, Any] = {**asdict(config), "load_data": names, "metadata": metadata or ""}
    header = mf.Header(
        dataset=storage.url,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        code_version=code_version(),
        cache_version=mf.CACHE_VERSION,
        config_hash=hashlib.sha256(json.dumps(config_dict, sort_keys=True).encode()).hexdigest()[
            :16
        ],
        config=config_dict,
        counts={**mf.field_counts(fields, len(rejected)), "environment": len(report.environment)},
    )
    manifest = mf.Manifest(header, classes, (), rejected, kind="cellpainting", fields=fields)
    mf.write(manifest, manifest_path or out / "manifest.json")
    report.seconds = time.monotonic() - started
    return report, manifest


def exit_code(report: BuildReport) -> int:
    """3 environment faults (re-run), 1 rejections only, 0 everything in."""
    return 3 if report.environment else 1 if report.rejected else 0


def run_build_cellpainting(
    source: str,
    out: Path,
    load_data: Sequence[str],
    metadata: str | None,
    workers: int,
    json_out: Path | None,
    manifest_path: Path | None = None,
    retries: int = 2,
    config: CellPaintingConfig | None = None,
    on_report: Callable[[BuildReport], None] | None = None,
) -> int:
    """CLI: build, print a summary; exit 0 / 1 / 3 (see ``exit_code``)."""
    report, manifest = build(
        source, out, load_data, metadata, config, workers, retries, manifest_path
    )
    if json_out:
        mf.atomic_write_text(json_out, json.dumps(asdict(report), indent=1) + "\n")
    console.print(
        f"build-cache (cellpainting): {len(manifest.fields)}/{report.fields} fields of "
        f"{report.plates} plates in the manifest ({report.written} written, {report.kept} kept), "
        f"{len(report.rejected)} rejected, {len(report.environment)} environment failures, "
        f"{report.seconds:.1f} s"
    )
    for r in report.rejected[:20]:
        console.print(f"[yellow]rejected[/yellow] {r['source']}: {r['reason']}")
    for r in report.environment[:20]:
        console.print(f"[red]not built (run again to retry)[/red] {r['source']}: {r['reason']}")
    if report.plates_left_out:
        console.print(
            f"[red]plates left out for environment failures: {', '.join(report.plates_left_out)}; "
            "run the same command again"
        )
    if on_report:
        on_report(report)
    return exit_code(report)
