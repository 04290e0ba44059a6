"""The ``Storage`` interface over an fsspec filesystem of buckets (s3fs today).

fsspec already does what a bucket backend needs: recursive listing with paging, ranged
streaming reads with a read-ahead buffer, single-request writes, retries. This class only maps
it onto octstage's interface: names relative to ``bucket/prefix`` and checked
(``check_name``), listings sorted and without folder placeholders, and every failure raised as a
``StorageError`` (``ObjectNotFoundError`` for a missing object) that names the URL and never a
credential. A backend subclass supplies its filesystem, its URL scheme, how an object's MD5 is
read from a listing entry, and how custom metadata is written.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO, cast

from fsspec import AbstractFileSystem

from octstage.errors import ObjectNotFoundError, StorageError
from octstage.storage.base import ObjectInfo, check_name, join_name
from octstage.storage.guarded import GuardedReader
from octstage.storage.locations import scrub

READ_CHUNK = 8 * 1024 * 1024


class FsspecStorage:
    """Objects under ``<scheme>://bucket/prefix`` through the fsspec filesystem ``fs``."""

    scheme = ""
    # What the filesystem raises once its own retries are spent (OSError covers most).
    errors: tuple[type[BaseException], ...] = (OSError, ValueError)

    def __init__(
        self,
        fs: AbstractFileSystem,
        bucket: str,
        prefix: str = "",
        secrets: list[str] | None = None,
    ) -> None:
        self.fs = fs
        self.bucket_name = bucket
        self.prefix = prefix.strip("/")
        self.url = f"{self.scheme}://{bucket}/{self.prefix}".rstrip("/")
        self._root = f"{bucket}/{self.prefix}".rstrip("/")
        self._secrets = list(secrets or [])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def secrets(self) -> list[str]:
        """Credential strings this store holds (for scrubbing any text shown)."""
        return list(self._secrets)

    # -- hooks ---------------------------------------------------------------------------------

    def md5_of(self, info: Mapping[str, Any]) -> str | None:
        """The object's MD5 (hex) from a listing or info entry, when the backend knows it."""
        return None

    def version_of(self, info: Mapping[str, Any]) -> str | None:
        """What changes whenever the object is rewritten, when the backend lists it."""
        return None

    def is_missing_bucket(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the bucket itself does not exist (not just the object)."""
        return False

    def write_options(self, metadata: Mapping[str, str]) -> dict[str, Any]:
        """Keyword arguments that store ``metadata`` with the object."""
        return {}

    # -- helpers -------------------------------------------------------------------------------

    def _full(self, name: str) -> str:
        return f"{self.bucket_name}/{join_name(self.prefix, check_name(name))}"

    def _rel(self, full: str) -> str:
        return full[len(self._root) + 1 :]

    def fail(self, name: str, exc: BaseException) -> StorageError:
        """The StorageError to raise for ``exc`` on object ``name`` (secrets scrubbed)."""
        where = f"{self.url}/{name}" if name else self.url
        if self.is_missing_bucket(exc):
            # Not ObjectNotFoundError: nothing below a missing bucket is "merely absent".
            return StorageError(f"{where}: no such bucket {self.bucket_name!r}")
        if isinstance(exc, FileNotFoundError):
            return ObjectNotFoundError(f"{where}: no such object")
        detail = scrub(f"{type(exc).__name__}: {exc}", self._secrets)
        return StorageError(f"{where}: {detail}")

    def _object(self, info: Mapping[str, Any]) -> ObjectInfo:
        return ObjectInfo(
            name=self._rel(str(info["name"])),
            size=int(info.get("size") or 0),
            md5=self.md5_of(info),
            version=self.version_of(info),
        )

    # -- the Storage interface -----------------------------------------------------------------

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        # List the deepest whole folder the prefix names, then filter by the rest: "a" must
        # match "ab.bin" as well as "a/x.bin", and "root" must never list "root2/...".
        folder = prefix.rpartition("/")[0]
        where = f"{self._root}/{folder}".rstrip("/")
        try:
            found = self.fs.find(where, detail=True)
        except self.errors as exc:
            raise self.fail(prefix, exc) from None
        head = f"{self._root}/{prefix}"
        infos = [
            info
            for name, info in cast("dict[str, Any]", found).items()
            # A name ending in "/" is a "folder" placeholder some tools create: not an object.
            if name.startswith(head) and not name.endswith("/") and info.get("type") == "file"
        ]
        for info in sorted(infos, key=lambda i: str(i["name"])):
            yield self._object(info)

    def stat(self, name: str) -> ObjectInfo:
        full = self._full(name)
        try:
            info = self.fs.info(full)
        except self.errors as exc:
            raise self.fail(name, exc) from None
        if info.get("type") != "file":  # a "folder": objects below it, none named so
            raise ObjectNotFoundError(f"{self.url}/{name}: no such object")
        return self._object(info)

    def open(self, name: str, chunk_size: int | None = None) -> BinaryIO:
        full = self._full(name)
        try:
            # The read-ahead buffer fetches what is asked plus one block: a header read with a
            # small chunk_size costs one small ranged GET, a whole-file read 8 MiB per request.
            inner = self.fs.open(
                full, "rb", block_size=chunk_size or READ_CHUNK, cache_type="readahead"
            )
        except self.errors as exc:
            raise self.fail(name, exc) from None
        reader = GuardedReader(inner, self.errors, lambda exc: self.fail(name, exc))
        return cast(BinaryIO, reader)

    def read_bytes(self, name: str) -> bytes:
        full = self._full(name)
        try:
            return bytes(self.fs.cat_file(full))
        except self.errors as exc:
            raise self.fail(name, exc) from None

    def write_bytes(
        self, name: str, data: bytes, metadata: Mapping[str, str] | None = None
    ) -> None:
        full = self._full(name)
        try:
            self.fs.pipe_file(full, data, **self.write_options(metadata or {}))
        except self.errors as exc:
            raise self.fail(name, exc) from None

    def delete(self, name: str) -> None:
        full = self._full(name)
        try:
            self.fs.rm_file(full)
        except FileNotFoundError:
            return
        except self.errors as exc:
            raise self.fail(name, exc) from None
