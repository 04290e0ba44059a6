"""One source file's work in ``build-cache``, as a dask worker runs it, and the cache's records.

A worker gets names, never bytes: it opens the source itself through ``open_storage``, hashes
the stream as it reads it (spooling a remote object to a temporary file), and decodes only when
the cache has nothing for that SHA1 and these parameters. It writes to the cache by its URL
(``cache.store.CacheStore``: a folder or a bucket), so a worker on another machine writes where
the driver reads. What it learns is kept beside the cache so a re-run needs no decoding:

- ``records/<cache_key>.json``: a built volume's manifest facts (written after the volume is
  complete, so a record always means a complete volume);
- ``rejects/<sha1>.json``: why these bytes cannot be built, valid for every parameter set of
  the same cache version. A rejection decided by the bytes alone (unreadable, truncated, radial
  grid...) is stored as its reason; one that depends on where the file sits (PatientID or eye
  disagreeing with the path) is stored as the two header values and decided again every run.

Only deterministic verdicts are stored. A failure of the machine rather than of the bytes (an
I/O error, no decoder installed for the syntax, a worker that died, an unexpected exception, a
source rewritten while read) is reported with the category ``environment`` and tried again on
the next run: remembering it would make a passing fault permanent.
"""

from __future__ import annotations

import functools
import hashlib
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import cv2

from octstage.cache import volumestore
from octstage.cache.store import CacheStore
from octstage.cachebuild.normalize import normalize_volume, scaled_spacing
from octstage.cachebuild.plan import ENVIRONMENT, Record, cache_key, header_verdict, sha1_mismatch
from octstage.config import BuildConfig
from octstage.dataset.dicom import read_header, read_volume
from octstage.dataset.ids import parse_oct_path
from octstage.errors import DicomEnvironmentError, DicomError, OctstageError, UnsafePathError
from octstage.manifest import CACHE_VERSION, Intensity
from octstage.storage import LocalStorage, Storage, check_name, open_storage

_READ_CHUNK = 4 << 20
CHANGED = f"{ENVIRONMENT}: source changed: rewritten while this build read it (run it again)"
# Stored rejections of another format (older ones could hold environment failures) are ignored.
REJECT_FORMAT = "octstage-reject/2"


def environment(detail: str) -> str:
    """The reason of a failure that is retried next run, never stored."""
    return f"{ENVIRONMENT}: {detail}"


def is_environment(reason: str) -> bool:
    return reason.startswith(f"{ENVIRONMENT}:")


@dataclass(frozen=True)
class Task:
    """What a worker needs to process one file (small and picklable: no bytes, no clients)."""

    source_url: str
    name: str
    cache_url: str  # a folder every worker sees, or a bucket URL
    config: BuildConfig
    expected_sha1: str | None = None  # from the source inventory


@dataclass(frozen=True)
class Outcome:
    """What happened to one file: a record (built or found), or a rejection reason."""

    name: str
    sha1: str | None
    record: Record | None = None
    reason: str | None = None
    read: bool = False
    decoded: bool = False


def record_name(key: str) -> str:
    return f"records/{key}.json"


def reject_name(sha1: str) -> str:
    return f"rejects/{sha1}.json"


def load_record(cache: CacheStore, key: str) -> Record | None:
    """The record of a complete volume for ``key``; None if either the record or the volume is
    missing (a run killed between the two leaves a volume without record: it is redone)."""
    data = cache.read_json(record_name(key))
    if not isinstance(data, dict):
        return None
    try:
        record = Record.from_dict(data)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if record.cache_key != key or not cache.has_volume(record.zarr_path):
        return None
    return record


def load_reject(cache: CacheStore, sha1: str, name: str) -> str | None:
    """Why the file ``name`` with these bytes is rejected, from the store; None if not known
    (or if its stored header values now fit its path: then it must be built)."""
    data = cache.read_json(reject_name(sha1))
    if not isinstance(data, dict) or data.get("cache_version") != CACHE_VERSION:
        return None
    if data.get("format") != REJECT_FORMAT:
        return None  # written before only deterministic verdicts were kept: decide it again
    header = data.get("header")
    if isinstance(header, dict):
        verdict = header_verdict(name, header.get("patient_id"), header.get("laterality"))
        return verdict if isinstance(verdict, str) else None
    reason = data.get("reason")
    return reason if isinstance(reason, str) else None


def _store_reject(
    cache: CacheStore, sha1: str, reason: str, header: dict[str, str | None] | None = None
) -> str:
    doc = {
        "format": REJECT_FORMAT,
        "sha1": sha1,
        "cache_version": CACHE_VERSION,
        "reason": reason,
        "header": header,
    }
    cache.write_json(reject_name(sha1), doc)
    return reason


@functools.lru_cache(maxsize=4)
def _cache(url: str) -> CacheStore:
    # One client per worker process and cache, not one per file.
    return CacheStore(url)


def forget_clients() -> None:
    """Drop this process's cached stores (their clients were made with the old settings)."""
    _cache.cache_clear()
    _storage.cache_clear()


@functools.lru_cache(maxsize=4)
def _storage(url: str) -> Storage:
    # One client per worker process and source, not one per file.
    return open_storage(url)


@dataclass(frozen=True)
class Spool:
    """A source file as read for one task: where pydicom reads it, and what was hashed."""

    path: Path
    sha1: str
    size: int
    stamp: tuple[int, int, int] | None = None  # local: (size, mtime_ns, inode) when hashed

    def unchanged(self) -> bool:
        """False if a local source was rewritten after hashing (its SHA1 is then not of the
        bytes decoded); a remote object was spooled to a private file and cannot change."""
        return self.stamp is None or _stamp(self.path) == self.stamp


def _stamp(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return (st.st_size, st.st_mtime_ns, st.st_ino)


@contextmanager
def spooled(storage: Storage, name: str) -> Iterator[Spool]:
    """The object as a local file with its SHA1 and size, hashed while the bytes stream in.

    pydicom then reads a file, not an in-memory copy: a worker holds the decoded volume and
    pydicom's Pixel Data, never a third copy of the source bytes. A local source is hashed in
    place; a remote one is spooled to a temporary file that is gone when the block ends.
    """
    digest = hashlib.sha1(usedforsecurity=False)
    size = 0
    if isinstance(storage, LocalStorage):
        path = storage.root / check_name(name)
        stamp = _stamp(path)
        with open(path, "rb") as fh:
            while chunk := fh.read(_READ_CHUNK):
                digest.update(chunk)
                size += len(chunk)
        yield Spool(path, digest.hexdigest(), size, stamp)
        return
    with tempfile.NamedTemporaryFile(prefix="octstage-", suffix=".dcm") as tmp:
        with storage.open(name) as fh:
            while chunk := fh.read(_READ_CHUNK):
                digest.update(chunk)
                size += len(chunk)
                tmp.write(chunk)
        tmp.flush()
        yield Spool(Path(tmp.name), digest.hexdigest(), size)


def run_task(task: Task) -> Outcome:
    """Process one file; every failure becomes a reason in the Outcome, never an exception."""
    cv2.setNumThreads(1)  # one dask thread per worker process: do not oversubscribe the cores
    try:
        with spooled(_storage(task.source_url), task.name) as spool:
            try:
                return _process(task, spool)
            except DicomEnvironmentError as exc:
                reason = environment(_dicom(exc, task.name))
                return Outcome(task.name, spool.sha1, reason=reason, read=True)
            except Exception as exc:  # noqa: BLE001 - one file's failure is reported, never fatal
                # Not a verdict on the bytes that we understand: retried, not remembered.
                reason = environment(f"unexpected {type(exc).__name__}: {exc}")
                return Outcome(task.name, spool.sha1, reason=reason, read=True)
    except UnsafePathError as exc:
        return Outcome(task.name, None, reason=f"layout: {exc}")
    except (OctstageError, OSError) as exc:
        return Outcome(task.name, None, reason=environment(f"unreadable source: {exc}"))


def _process(task: Task, spool: Spool) -> Outcome:
    name, root, sha1 = task.name, _cache(task.cache_url), spool.sha1
    if task.expected_sha1 is not None and task.expected_sha1 != sha1:
        return Outcome(name, sha1, reason=sha1_mismatch(name, task.expected_sha1, sha1), read=True)
    key = cache_key(sha1, task.config)
    record = load_record(root, key)
    if record is not None:
        return Outcome(name, sha1, record=record, read=True)
    stored = load_reject(root, sha1, name)
    if stored is not None:
        return Outcome(name, sha1, reason=stored, read=True)

    def reject(
        reason: str, facts: dict[str, str | None] | None = None, decoded: bool = False
    ) -> Outcome:
        # Only what was decided from the hashed bytes is stored under their SHA1.
        if not spool.unchanged():
            return Outcome(name, sha1, reason=CHANGED, read=True, decoded=decoded)
        _store_reject(root, sha1, reason, facts)
        return Outcome(name, sha1, reason=reason, read=True, decoded=decoded)

    try:
        header = read_header(spool.path, name)
    except DicomEnvironmentError:
        raise  # run_task reports it as an environment failure, unstored
    except DicomError as exc:
        return reject(_dicom(exc, name))
    problem = header.problem()
    if problem is not None:
        return reject(f"{problem[0].value.replace('_', ' ')}: {problem[1]}")
    verdict = header_verdict(name, header.patient_id, header.laterality)
    if isinstance(verdict, str):
        return reject(verdict, {"patient_id": header.patient_id, "laterality": header.laterality})
    participant_id, laterality = verdict
    path = parse_oct_path(name)
    assert path is not None  # header_verdict() accepted the layout
    spacing = header.spacing_mm
    assert spacing is not None  # problem() refuses files without spacing

    try:
        with warnings.catch_warnings():
            # A damaged file's reason goes to the manifest; a console warning would only
            # tear the progress bar.
            warnings.simplefilter("ignore")
            _, volume = read_volume(spool.path, name)
    except DicomEnvironmentError:
        raise
    except DicomError as exc:
        return reject(_dicom(exc, name), decoded=True)
    if not spool.unchanged():
        return Outcome(name, sha1, reason=CHANGED, read=True, decoded=True)
    cfg = task.config
    array, norm = normalize_volume(
        volume, cfg.shape, cfg.p_low, cfg.p_high, cfg.subsample, cfg.resize
    )
    del volume  # the source-sized array is not needed for the write: free it first
    relpath = volumestore.volume_relpath(participant_id, key)
    stored_spacing = scaled_spacing(spacing, header.shape, cfg.shape)
    # The only header facts stored with the array (no names, dates or other PHI).
    attributes = {
        "device": path.device,
        "laterality": laterality,
        "transfer_syntax": header.transfer_syntax,
        "source_shape": list(header.shape),
        "source_spacing_mm": list(spacing),
        "spacing_mm": list(stored_spacing),
        "normalization": asdict(norm),
    }
    checksum = root.write_volume(
        relpath, array, stored_spacing, attributes, chunks=cfg.chunks, clevel=cfg.clevel
    )
    record = Record(
        cache_key=key,
        source_sha1=sha1,
        source_size=spool.size,
        patient_id=participant_id,
        laterality=laterality,
        transfer_syntax=header.transfer_syntax,
        source_shape=header.shape,
        spacing_mm=spacing,
        zarr_path=relpath,
        shape=(int(array.shape[0]), int(array.shape[1]), int(array.shape[2])),
        dtype=str(array.dtype),
        normalization=norm,
        checksum=checksum,
        intensity=Intensity.of(array, channels_first=False),
    )
    root.write_json(record_name(key), record.to_dict())
    return Outcome(name, sha1, record=record, read=True, decoded=True)


def _dicom(exc: DicomError, name: str) -> str:
    return f"DICOM: {str(exc).removeprefix(f'{name}: ')}"
