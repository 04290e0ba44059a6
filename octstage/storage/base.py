"""The storage interface every backend implements, and object-name safety rules."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from octstage.errors import UnsafePathError


@dataclass(frozen=True)
class ObjectInfo:
    """An object as listed: name relative to the storage root, size, and hashes when known.

    ``sha1`` is the *source* SHA1: B2's native content SHA1 (or ``large_file_sha1``), or the
    ``source-sha1`` metadata octstage records on GCS objects after verifying a copy.
    """

    name: str
    size: int
    sha1: str | None = None
    md5: str | None = None
    # This version of the object, when the store names one (B2 file id, GCS generation, S3
    # ETag): it changes whenever the object is rewritten, so a hash taken of one version is
    # never applied to the next.
    version: str | None = None
    # Why the listed name cannot be read (a dangling symlink, a symlink loop): the file is
    # excluded with this reason instead of ending the run. ``transient``: it may read on a
    # later run (a link whose target may come back, a permission), so it is never remembered.
    problem: str | None = None
    transient: bool = False


class Storage(Protocol):
    """What octstage needs from a store: list, read, write atomically, delete."""

    url: str

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose name starts with ``prefix`` (recursive, sorted by name)."""
        ...

    def stat(self, name: str) -> ObjectInfo:
        """One object's info; StorageError if it does not exist."""
        ...

    def open(self, name: str, chunk_size: int | None = None) -> BinaryIO:
        """A streaming binary reader; StorageError if the object does not exist.

        ``chunk_size`` is how much a remote backend fetches per request: small for header-only
        reads (a DICOM header is kilobytes of a 100 MB object), the default for whole files.
        """
        ...

    def read_bytes(self, name: str) -> bytes:
        """The whole object."""
        ...

    def write_bytes(
        self, name: str, data: bytes, metadata: Mapping[str, str] | None = None
    ) -> None:
        """Create or replace an object atomically (never visible half-written)."""
        ...

    def delete(self, name: str) -> None:
        """Remove an object (no error if it is already gone)."""
        ...


def check_name(name: str) -> str:
    """Return ``name`` if it is a safe relative object name; raise UnsafePathError otherwise.

    Refuses empty names, absolute paths, backslashes and any ``.``/``..`` segment: such a name
    could escape the folder it is copied into.
    """
    if not name or name.startswith("/") or "\\" in name or "\x00" in name:
        raise UnsafePathError(f"unsafe object name {name!r}: absolute, empty or odd separator")
    if any(part in ("", ".", "..") for part in name.split("/")):
        raise UnsafePathError(f"unsafe object name {name!r}: empty, '.' or '..' segment")
    return name


def split_url(url: str) -> tuple[str, str]:
    """(folder, name) of a file's local path or URL, for ``open_storage(folder).read_bytes(name)``:
    a bare name is the current folder's, ``/name`` the root's (an empty folder would open the
    current one and read another file of that name)."""
    folder, sep, name = url.rstrip("/").rpartition("/")
    return folder or ("/" if sep else "."), name


def join_name(prefix: str, name: str) -> str:
    """``prefix/name`` without doubled slashes (either may be empty)."""
    prefix = prefix.strip("/")
    return f"{prefix}/{name}" if prefix else name
