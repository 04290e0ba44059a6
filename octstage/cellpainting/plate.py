"""One plate of a Cell Painting build: read every field once, then normalize and write.

Pass 1 reads each field's channel files through the storage layer (a thread pool), hashes them
(SHA1), decodes and illumination-corrects them, keeps a pixel sample for the plate's
percentiles and the corrected field in a local scratch folder; pass 2 normalizes every field with
the plate's per-channel percentiles and writes it into the cache, a folder or a bucket
(``CacheStore.write_field``). The failure rules are ``build.py``'s: a data fault rejects a
field, an environment fault (retried ``retries`` times) leaves the whole plate out of this run.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from octstage import manifest as mf
from octstage.cache.store import CacheStore
from octstage.cellpainting import layout
from octstage.cellpainting.fieldstore import field_relpath
from octstage.cellpainting.normalize import (
    correct,
    decode_illum,
    decode_tiff,
    plate_normalization,
    sample,
    to_uint8,
)
from octstage.errors import CellPaintingError, ConfigError, ObjectNotFoundError, StorageError
from octstage.storage import Storage

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
        if len(dtypes) != 1:  # one channel's scale would be wrong by a factor of 257
            found = ", ".join(
                f"{n} {p.dtype}" for (_, n), p in zip(row.images, planes, strict=True)
            )
            raise CellPaintingError(f"{row.item_id}: channels differ in pixel type: {found}")
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


def _one_pixel_type(reads: list[_Read], report: BuildReport) -> list[_Read]:
    """The fields of the plate's most common pixel type; the others are rejections naming
    both types (an 8-bit TIFF among 16-bit ones would be scaled by the plate's 16-bit
    percentiles into a black field)."""
    counts: dict[str, int] = {}
    for r in reads:
        counts[r.dtype] = counts.get(r.dtype, 0) + 1
    if len(counts) < 2:
        return reads
    common = max(sorted(counts), key=counts.__getitem__)
    for r in reads:
        if r.dtype != common:
            names = ", ".join(s.path for s in r.sources)
            report.rejected.append(
                {
                    "source": r.row.item_id,
                    "reason": f"{names}: pixel type {r.dtype}, the plate's other fields are "
                    f"{common} ({counts[common]} fields): its percentiles would not fit",
                }
            )
    return [r for r in reads if r.dtype == common]


def build_plate(
    storage: Storage,
    rows: list[layout.FieldRow],
    cache: CacheStore,
    split: str,
    perturbations: dict[tuple[str, str], layout.Perturbation],
    config: CellPaintingConfig,
    workers: int,
    retries: int,
    report: BuildReport,
) -> list[tuple[mf.Field, str]]:
    """Pass 1 and 2 for one plate: its fields (label filled in later) or [] when left out."""
    plate = rows[0].plate
    # The corrected float fields between the passes: beside a folder cache (its disk was chosen
    # for size), in the machine's temp folder for a bucket cache; removed when the plate is done.
    with tempfile.TemporaryDirectory(prefix=".scratch-", dir=cache.local) as scratch_dir:
        scratch = Path(scratch_dir)
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
        good = _one_pixel_type([r for r in reads if not (r.rejected or r.environment)], report)
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
            existed = cache.has_field(rel)
            channels = tuple(c for c, _ in r.row.images)
            checksum = cache.write_field(
                rel, array, channels, {"item_id": r.row.item_id}, config.chunk, config.clevel
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
                        intensity=mf.Intensity.of(array, channels_first=True),
                    ),
                    pert.perturbation if pert else "",
                )
            )
        return fields
