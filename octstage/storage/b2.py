"""Backblaze B2 backend (b2sdk): listing with SHA1, ranged streaming reads, writes, deletes.

Listing goes straight to ``b2_list_file_names`` with 10,000 names per call (B2's maximum), so
a 25,000-object inventory costs 3 calls. B2 keeps a file's SHA1 in ``contentSha1``; for large
files that is ``none`` and the SHA1 is in the ``large_file_sha1`` file info, only if the
uploader provided it. A file with neither is listed with ``sha1=None`` (unverifiable).

Credentials come from the location's rclone b2 remote or the B2_* variables
(``locations.b2_credentials``) and stay in memory: b2sdk's default account info would
write the key under HOME, so ``InMemoryAccountInfo`` is used.
"""

from __future__ import annotations

import io
import logging
import re
import threading
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO, cast

from b2sdk.v2 import B2Api, InMemoryAccountInfo, InMemoryCache
from b2sdk.v2.exception import B2Error, FileNotPresent, NonExistentBucket

from octstage.errors import ObjectNotFoundError, StorageError
from octstage.storage.base import ObjectInfo, check_name, join_name
from octstage.storage.locations import B2Credentials, Location, b2_credentials

LIST_PAGE = 10_000
READ_CHUNK = 8 * 1024 * 1024
_SHA1_RE = re.compile(r"^[0-9a-f]{40}$")
# b2sdk's DEBUG output traces calls (with auth tokens); our -v must not turn that on.
logging.getLogger("b2sdk").setLevel(max(logging.getLogger("b2sdk").level, logging.WARNING))

_apis: dict[tuple[str, str], B2Api] = {}
_apis_lock = threading.Lock()


def b2_api(creds: B2Credentials) -> B2Api:
    """An authorized B2Api per key and realm, per process (authorizing costs a call)."""
    key = (creds.key_id, creds.realm)
    with _apis_lock:
        api = _apis.get(key)
        if api is None:
            api = B2Api(InMemoryAccountInfo(), cache=InMemoryCache())
            try:
                api.authorize_account(creds.realm, creds.key_id, creds.key)
            except (B2Error, OSError) as exc:
                # b2sdk's messages do not contain the key; the class and status do the job.
                raise StorageError(f"B2 authorization failed: {type(exc).__name__}") from None
            _apis[key] = api
        return api


def source_sha1(content_sha1: str | None, file_info: Mapping[str, str] | None) -> str | None:
    """The SHA1 B2 knows for a file: ``contentSha1``, else ``large_file_sha1``; else None."""
    candidates = [content_sha1 or "", (file_info or {}).get("large_file_sha1", "")]
    for value in candidates:
        value = value.lower().removeprefix("unverified:")
        if _SHA1_RE.match(value):
            return value
    return None


class _RangeReader(io.RawIOBase):
    """A seekable reader that fetches ``READ_CHUNK``-sized ranges on demand."""

    def __init__(self, storage: B2Storage, full_name: str, size: int) -> None:
        self._storage = storage
        self._name = full_name
        self._size = size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._pos >= self._size or len(view) == 0:
            return 0
        end = min(self._pos + len(view), self._size) - 1
        data = self._storage._download(self._name, (self._pos, end))
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)


class B2Storage:
    """Objects under ``b2://bucket/prefix``."""

    def __init__(self, api: B2Api, bucket: str, prefix: str = "") -> None:
        self.api = api
        self.bucket_name = bucket
        self.prefix = prefix.strip("/")
        self.url = f"b2://{bucket}/{self.prefix}".rstrip("/")
        try:
            self._bucket = api.get_bucket_by_name(bucket)
        except (NonExistentBucket, B2Error) as exc:
            raise StorageError(f"b2://{bucket}: bucket not found ({type(exc).__name__})") from None

    @classmethod
    def from_location(cls, loc: Location) -> B2Storage:
        return cls(b2_api(b2_credentials(loc)), loc.bucket, loc.prefix)

    def secrets(self) -> list[str]:
        """The live auth token (for scrubbing; the key pair is known to storage.locations)."""
        token = self.api.account_info.get_account_auth_token()
        return [token] if token else []

    def _full(self, name: str) -> str:
        return join_name(self.prefix, check_name(name))

    def _rel(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    def _fail(self, name: str, exc: Exception) -> StorageError:
        if isinstance(exc, FileNotPresent):
            return ObjectNotFoundError(f"{self.url}/{name}: no such object")
        return StorageError(f"{self.url}/{name}: {type(exc).__name__}: {exc}")

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        full_prefix = f"{self.prefix}/{prefix}" if self.prefix else prefix
        start: str | None = None
        session = self.api.session
        while True:
            try:
                page = session.list_file_names(
                    self._bucket.id_, start, LIST_PAGE, full_prefix or None
                )
            except (B2Error, OSError) as exc:
                raise self._fail(prefix, exc) from None
            for entry in page["files"]:
                if entry.get("action") != "upload":
                    continue
                yield ObjectInfo(
                    name=self._rel(entry["fileName"]),
                    size=int(entry.get("contentLength", entry.get("size", 0))),
                    sha1=source_sha1(entry.get("contentSha1"), entry.get("fileInfo")),
                    version=entry.get("fileId"),
                )
            start = page.get("nextFileName")
            if not start:
                return

    def stat(self, name: str) -> ObjectInfo:
        try:
            version = self._bucket.get_file_info_by_name(self._full(name))
        except (B2Error, OSError) as exc:
            raise self._fail(name, exc) from None
        return ObjectInfo(
            name, int(version.size), source_sha1(version.content_sha1, version.file_info)
        )

    def _download(self, full_name: str, byte_range: tuple[int, int] | None = None) -> bytes:
        buf = io.BytesIO()
        try:
            self._bucket.download_file_by_name(full_name, range_=byte_range).save(buf)
        except (B2Error, OSError) as exc:
            raise self._fail(self._rel(full_name), exc) from None
        return buf.getvalue()

    def open(self, name: str, chunk_size: int | None = None) -> BinaryIO:
        size = self.stat(name).size
        raw = _RangeReader(self, self._full(name), size)
        return cast(BinaryIO, io.BufferedReader(raw, buffer_size=chunk_size or READ_CHUNK))

    def read_bytes(self, name: str) -> bytes:
        return self._download(self._full(name))

    def write_bytes(
        self, name: str, data: bytes, metadata: Mapping[str, str] | None = None
    ) -> None:
        try:
            self._bucket.upload_bytes(data, self._full(name), file_info=dict(metadata or {}))
        except (B2Error, OSError) as exc:
            raise self._fail(name, exc) from None

    def delete(self, name: str) -> None:
        """Delete every version of ``name`` (B2 keeps versions; a hide marker would linger)."""
        full = self._full(name)
        try:
            versions = [v for v in self._bucket.list_file_versions(full) if v.file_name == full]
            for version in versions:
                self.api.delete_file_version(version.id_, version.file_name)
        except FileNotPresent:
            return
        except (B2Error, OSError) as exc:
            raise self._fail(name, exc) from None
