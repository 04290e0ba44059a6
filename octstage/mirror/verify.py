"""Verify mirrored objects where they now live, against the source SHA1; re-copy what differs.

B2 and GCS share no hash, and rclone can leave a corrupt object behind (it checks B2's SHA1 at
the end of the stream, after GCS has committed the upload), so size and time prove nothing.
Each new or changed object is read back at the destination (in-region: no second B2 egress),
hashed with SHA1 and compared with the inventory. A match is recorded at the destination (GCS
metadata, see ``octstage.storage.gcs``) so later runs need neither B2 nor a download. A mismatch
is deleted, copied again and re-checked once; an object whose source has no SHA1 is reported as
unverified, never silently accepted. Every outcome is per object: nothing here raises for one
bad object.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from octstage.errors import StorageError
from octstage.mirror.inventory import Entry
from octstage.storage.base import check_name
from octstage.storage.local import LocalStorage

if TYPE_CHECKING:  # google-cloud-storage is imported only when a gs:// location is opened
    from octstage.storage.gcs import BlobState, GcsStorage

Status = Literal["verified", "recopied", "unverified", "corrupt", "missing"]
FAILED: tuple[Status, ...] = ("corrupt", "missing")
CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class Outcome:
    name: str
    status: Status
    detail: str = ""
    bytes_hashed: int = 0


@dataclass(frozen=True)
class Digest:
    sha1: str
    size: int
    state: BlobState | None  # what was hashed, for recording (GCS)


class Destination(Protocol):
    def digest(self, name: str) -> Digest: ...

    def record(self, name: str, digest: Digest) -> None: ...


class GcsDestination:
    """Hash a pinned generation; record the source SHA1 as metadata on exactly it.

    Generations come from one listing made up front (a lookup per object would add a request
    each); a name is looked up afresh after its first use, as a re-copy makes a new generation.
    """

    def __init__(self, storage: GcsStorage) -> None:
        self.storage = storage
        self._listed = {s.name: s for s in storage.states()}
        self._lock = threading.Lock()

    def digest(self, name: str) -> Digest:
        with self._lock:
            state = self._listed.pop(name, None)
        if state is None:
            state = self.storage.state(name)
        sha1, size = self.storage.sha1_of(state)
        return Digest(sha1, size, state)

    def record(self, name: str, digest: Digest) -> None:
        assert digest.state is not None
        self.storage.record_source_sha1(digest.state, digest.sha1)


class LocalDestination:
    """Hash the file. Nothing is recorded: a local mirror is re-hashed on every run."""

    def __init__(self, storage: LocalStorage) -> None:
        self.root = Path(storage.root)

    def digest(self, name: str) -> Digest:
        path = self.root / check_name(name)
        digest = hashlib.sha1()
        size = 0
        try:
            with open(path, "rb") as fh:
                while chunk := fh.read(CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
        except FileNotFoundError:
            raise StorageError(f"{path}: no such object") from None
        return Digest(digest.hexdigest(), size, None)

    def record(self, name: str, digest: Digest) -> None:
        return None


def verify_one(
    entry: Entry, dst: Destination, recopy: Callable[[str], str | None], absent: bool = False
) -> Outcome:
    """Check one object; on a mismatch (or if it is missing) re-copy it once and re-check.

    ``absent``: the destination listing lacks the object (or has another size).
    """
    if entry.sha1 is None:
        error = recopy(entry.name) if absent else None
        if error:
            return Outcome(entry.name, "missing", f"copy failed: {error}")
        return Outcome(entry.name, "unverified", "the source has no SHA1 for this object")
    hashed = 0
    first = ""
    for attempt in (1, 2):
        try:
            digest = dst.digest(entry.name)
            hashed += digest.size
            if digest.sha1 == entry.sha1 and digest.size == entry.size:
                dst.record(entry.name, digest)
                status: Status = "verified" if attempt == 1 else "recopied"
                return Outcome(entry.name, status, first, hashed)
            problem = f"sha1 {digest.sha1} size {digest.size} != source {entry.sha1} {entry.size}"
        except (StorageError, OSError) as exc:  # OSError: requests' transport errors
            problem = str(exc)
        if attempt == 1:
            first = f"first check: {problem}"
            error = recopy(entry.name)
            if error:
                return Outcome(entry.name, "missing", f"{first}; re-copy failed: {error}", hashed)
    return Outcome(entry.name, "corrupt", f"{first}; after re-copy: {problem}", hashed)


def verify_all(
    entries: Iterable[Entry],
    dst: Destination,
    recopy: Callable[[str], str | None],
    workers: int,
    on_done: Callable[[Outcome], None] | None = None,
    absent: Collection[str] = (),
) -> list[Outcome]:
    """``verify_one`` for every entry, ``workers`` at a time, in input order."""
    items = list(entries)
    outcomes: list[Outcome] = []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        check = lambda e: verify_one(e, dst, recopy, e.name in absent)  # noqa: E731
        for outcome in pool.map(check, items):
            outcomes.append(outcome)
            if on_done is not None:
                on_done(outcome)
    return outcomes
