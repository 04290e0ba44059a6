"""One plate of a Cell Painting build, streamed twice from the source, in bounded memory.

Pass 1 reads each field's channel files through the storage layer (a thread pool with at most
``window`` fields in flight), hashes them (SHA1), decodes and illumination-corrects them and adds
them to the plate's per-channel 16-bit histograms (``normalize.histogram``): the exact
percentiles come from there, with nothing kept per field but its hashes. Pass 2 computes each
field's cache key (source hashes, illumination, the plate's percentiles, the settings); a field
already in the cache is kept without being read again; the others are read again (their SHA1
must equal pass 1's: a source that changed under the build is an environment fault), normalized
and written into the cache, a folder or a bucket (``CacheStore.write_field``). So memory is the
window's fields plus the histograms, and no scratch is written, however large the plate: the
price is reading each new field twice. The failure rules are ``build.py``'s: a data fault
rejects a field, an environment fault (retried ``retries`` times) leaves the whole plate out of
this run.
"""

from __future__ import annotations

import hashlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np

from octstage import manifest as mf
from octstage.bounded import bounded_map
from octstage.cache.store import CacheStore
from octstage.cellpainting import layout
from octstage.cellpainting.fieldwriter import Stored, writer_for
from octstage.cellpainting.metadata import Perturbation
from octstage.cellpainting.normalize import (
    correct,
    decode_illum,
    decode_tiff,
    histogram,
    plate_normalization,
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
    unlabelled: int = 0  # fields the metadata does not list, built with --allow-unlabelled

    def merge(self, part: BuildReport) -> None:
        """A plate's report (built on a dask worker) into the build's."""
        self.written += part.written
        self.kept += part.kept
        self.rejected.extend(part.rejected)
        self.environment.extend(part.environment)
        self.plates_left_out.extend(part.plates_left_out)


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


@dataclass(slots=True)
class _Read:
    """One field after pass 1 (its histogram is added to the plate's, then dropped)."""

    row: layout.FieldRow
    sources: tuple[mf.ChannelSource, ...] = ()
    dtype: str = ""
    hist: np.ndarray | None = None
    rejected: str = ""
    environment: str = ""


def _decode(
    storage: Storage,
    row: layout.FieldRow,
    illum: dict[str, np.ndarray] | None,
    retries: int,
    expect: tuple[mf.ChannelSource, ...] = (),
) -> tuple[np.ndarray, tuple[mf.ChannelSource, ...], str]:
    """The field's corrected float32 ``[C, Y, X]``, its sources and dtypes; with ``expect``
    (pass 2), each file's SHA1 must be pass 1's."""
    planes, sources = [], []
    for i, (channel, name) in enumerate(row.images):
        data = _read(storage, name, retries)
        src = mf.ChannelSource(channel, name, hashlib.sha1(data).hexdigest(), len(data))
        if expect and src != expect[i]:
            raise EnvironmentFault(f"{name}: changed at the source during the build (run again)")
        sources.append(src)
        planes.append(decode_tiff(data, name))
        del data
    shapes = {p.shape for p in planes}
    if len(shapes) != 1:
        raise CellPaintingError(f"{row.item_id}: channels differ in shape: {sorted(shapes)}")
    if len({p.dtype for p in planes}) != 1:  # one channel's scale would be wrong by 257x
        found = ", ".join(f"{n} {p.dtype}" for (_, n), p in zip(row.images, planes, strict=True))
        raise CellPaintingError(f"{row.item_id}: channels differ in pixel type: {found}")
    dtypes = str(planes[0].dtype)
    corrected = np.stack(
        [
            correct(p, None if illum is None else illum[c], name)
            for (c, name), p in zip(row.images, planes, strict=True)
        ]
    )
    return corrected, tuple(sources), dtypes


def _read_field(
    storage: Storage, row: layout.FieldRow, illum: dict[str, np.ndarray] | None, retries: int
) -> _Read:
    out = _Read(row)
    try:
        corrected, out.sources, out.dtype = _decode(storage, row, illum, retries)
        out.hist = histogram(corrected)
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


@dataclass(slots=True)
class _Written:
    """One field after pass 2."""

    read: _Read
    key: str
    stored: Stored | None = None  # where and what the field is in the cache (``fieldwriter``)
    existed: bool = False
    environment: str = ""


class _Pass1:
    """What pass 1 keeps of a plate's good fields until pass 2, with no Python object per field
    (objects made one by one while pixel buffers come and go pin the allocator's pages: a plate
    is thousands of fields): each field's row, its files' SHA1s and sizes, its pixel type."""

    def __init__(self, rows: list[layout.FieldRow], channels: int) -> None:
        self.rows = rows
        self.index = np.empty(len(rows), np.int64)
        self.sha1 = np.empty((len(rows), channels, 20), np.uint8)
        self.size = np.empty((len(rows), channels), np.int64)
        self.dtype = np.empty(len(rows), np.int16)
        self.types: list[str] = []  # dtype codes -> names
        self.n = 0

    def add(self, index: int, r: _Read) -> None:
        k = self.n
        self.index[k] = index
        digests = b"".join(bytes.fromhex(s.sha1) for s in r.sources)
        self.sha1[k] = np.frombuffer(digests, np.uint8).reshape(-1, 20)
        self.size[k] = [s.size for s in r.sources]
        if r.dtype not in self.types:
            self.types.append(r.dtype)
        self.dtype[k] = self.types.index(r.dtype)
        self.n += 1

    def read(self, k: int) -> _Read:
        """Field ``k`` as pass 1 read it (its row, sources and pixel type)."""
        row = self.rows[int(self.index[k])]
        sources = tuple(
            mf.ChannelSource(c, name, self.sha1[k, i].tobytes().hex(), int(self.size[k, i]))
            for i, (c, name) in enumerate(row.images)
        )
        return _Read(row, sources, self.types[int(self.dtype[k])])

    def only(self, dtype: str) -> None:
        """Keep the fields of one pixel type."""
        keep = self.dtype[: self.n] == self.types.index(dtype)
        for name in ("index", "sha1", "size", "dtype"):
            setattr(self, name, getattr(self, name)[: self.n][keep])
        self.n = int(keep.sum())


def _one_pixel_type(
    kept: _Pass1, hists: dict[str, np.ndarray], report: BuildReport
) -> np.ndarray | None:
    """Keep the fields of the plate's most common pixel type and return their summed
    histogram; the others are rejections naming both types (an 8-bit TIFF among 16-bit ones
    would be scaled by the plate's 16-bit percentiles into a black field)."""
    if not kept.n:
        return None
    codes = np.bincount(kept.dtype[: kept.n], minlength=len(kept.types))
    counts = {t: int(codes[i]) for i, t in enumerate(kept.types) if codes[i]}
    common = max(sorted(counts), key=counts.__getitem__)
    for k in np.flatnonzero(kept.dtype[: kept.n] != kept.types.index(common)):
        r = kept.read(int(k))
        names = ", ".join(s.path for s in r.sources)
        report.rejected.append(
            {
                "source": r.row.item_id,
                "reason": f"{names}: pixel type {r.dtype}, the plate's other fields are "
                f"{common} ({counts[common]} fields): its percentiles would not fit",
            }
        )
    kept.only(common)
    return hists[common]


def build_plate(
    storage: Storage,
    rows: list[layout.FieldRow],
    cache: CacheStore,
    split: str,
    perturbations: dict[tuple[str, str], Perturbation],
    config: CellPaintingConfig,
    workers: int,
    retries: int,
    report: BuildReport,
    spool: mf.FieldSpool,
    window: int = 0,
    pack: int = 0,
) -> int:
    """Pass 1 and 2 for one plate: its fields go into ``spool`` (label left to the manifest) as
    they are written, committed once the whole plate is; returns how many (0: left out).
    ``window``: fields in flight at once (default ``2 * workers``); ``pack``: fields per pack
    (0 or 1: one array per field; ``fieldwriter``)."""
    plate = rows[0].plate
    window = window or 2 * max(1, workers)
    try:
        illum, illum_sources = _plate_illum(storage, rows, retries) if config.illum else (None, ())
    except EnvironmentFault as exc:
        report.environment.append({"source": plate, "reason": f"{ENVIRONMENT}: {exc}"})
        report.plates_left_out.append(plate)
        return 0
    except CellPaintingError as exc:
        report.rejected.extend({"source": r.item_id, "reason": str(exc)} for r in rows)
        return 0
    n_channels = len(rows[0].images)
    hists: dict[str, np.ndarray] = {}  # pixel type -> the plate's summed histograms
    kept = _Pass1(rows, n_channels)
    environment = False
    with ThreadPoolExecutor(max(1, workers)) as pool:
        reads = bounded_map(
            pool, lambda row: _read_field(storage, row, illum, retries), rows, window
        )
        for index, r in enumerate(reads):
            if r.rejected:
                report.rejected.append({"source": r.row.item_id, "reason": r.rejected})
            elif r.environment:
                environment = True
                report.environment.append(
                    {"source": r.row.item_id, "reason": f"{ENVIRONMENT}: {r.environment}"}
                )
            else:
                assert r.hist is not None
                if r.hist.shape[0] != n_channels:
                    r.rejected = f"{r.row.item_id}: {r.hist.shape[0]} channels, not {n_channels}"
                    report.rejected.append({"source": r.row.item_id, "reason": r.rejected})
                    continue
                # one histogram per pixel type: which type is the plate's is known at the end
                if r.dtype in hists:
                    hists[r.dtype] += r.hist
                else:
                    hists[r.dtype] = r.hist
                r.hist = None
                kept.add(index, r)
        if environment:
            report.plates_left_out.append(plate)
            return 0
        hist = _one_pixel_type(kept, hists, report)
        if not kept.n or hist is None:
            return 0
        norms = plate_normalization(hist, config.p_low, config.p_high)

        keys = [_cache_key(kept.read(k), illum_sources, norms, config) for k in range(kept.n)]
        writer = writer_for(cache, plate, config.chunk, config.clevel, pack)
        writer.plan(keys)

        def write(item: tuple[_Read, str]) -> _Written:
            r, key = item
            out = _Written(r, key)
            try:
                out.stored = writer.stored(key)
                if out.stored is not None:
                    out.existed = True
                    return out
                corrected, _, _ = _decode(storage, r.row, illum, retries, expect=r.sources)
                array = to_uint8(corrected, norms)
                del corrected
                channels = tuple(c for c, _ in r.row.images)
                out.stored = writer.write(key, r.row.item_id, array, channels)
            except (EnvironmentFault, CellPaintingError, StorageError, OSError) as exc:
                # pass 1 decoded these very bytes: a failure now is the machine's, not the data's
                out.environment = str(exc)
            return out

        out = spool.plate()
        existed = 0
        try:
            try:
                todo = ((kept.read(k), keys[k]) for k in range(kept.n))
                for w in bounded_map(pool, write, todo, window):
                    if w.environment:
                        environment = True
                        report.environment.append(
                            {
                                "source": w.read.row.item_id,
                                "reason": f"{ENVIRONMENT}: {w.environment}",
                            }
                        )
                    elif not environment:  # a plate left out keeps none: stop spooling
                        existed += w.existed
                        out.add(_field(w, plate, split, perturbations, norms, illum_sources))
            finally:
                writer.close()
            if environment:
                report.plates_left_out.append(plate)
                return 0
            out.commit()
        finally:
            out.close()
    report.kept += existed
    report.written += out.tally.fields - existed
    return out.tally.fields


def _field(
    w: _Written,
    plate: str,
    split: str,
    perturbations: dict[tuple[str, str], Perturbation],
    norms: tuple[mf.Normalization, ...],
    illum: tuple[mf.ChannelSource, ...],
) -> mf.Field:
    r, stored = w.read, w.stored
    assert stored is not None
    pert = perturbations.get((plate, r.row.well))
    return mf.Field(
        item_id=r.row.item_id,
        split=split,
        label=None,
        zarr_path=stored.zarr_path,
        shape=stored.shape,
        dtype="uint8",
        checksum=stored.checksum,
        cache_key=w.key,
        sources=r.sources,
        source=r.row.source,
        batch=r.row.batch,
        plate=plate,
        well=r.row.well,
        site=r.row.site,
        channels=tuple(c for c, _ in r.row.images),
        perturbation=pert.perturbation if pert else "",
        perturbation_type=pert.perturbation_type if pert else "",
        is_control=bool(pert and pert.is_control),
        normalization=norms,
        illum=illum,
        source_dtype=r.dtype,
        intensity=stored.intensity,
        pack_index=stored.pack_index,
    )
