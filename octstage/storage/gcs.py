"""Google Cloud Storage backend (google-cloud-storage): streamed reads, verified-copy metadata.

Reads stream through ``BlobReader`` pinned to the generation that was looked up, so a reader
never mixes two versions of an object and nothing is copied to local disk first. Writes are
single uploads (GCS makes an object visible only once complete).

After ``octstage mirror`` verifies a copied object against the source SHA1 it records two custom
metadata keys: ``source-sha1`` and ``source-sha1-crc32c`` (GCS's own CRC32C of the bytes that
were hashed). A listing reports ``sha1`` only while both still agree with the object, so an
object replaced later (by any tool) is never mistaken for a verified copy, and later checks need
neither B2 nor a download.

The client comes from the location's rclone remote when there is one (``endpoint``,
``anonymous``, ``service_account_file``/``_credentials``, ``project_number``) and otherwise from
Google's defaults, which honour ``STORAGE_EMULATOR_HOST``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from google.api_core import exceptions as gexc
from google.auth.exceptions import DefaultCredentialsError
from google.cloud import storage
from google.cloud.storage.exceptions import DataCorruption, InvalidResponse
from requests.adapters import HTTPAdapter

from octstage.errors import ObjectNotFoundError, StorageError
from octstage.storage.base import ObjectInfo, check_name, join_name
from octstage.storage.guarded import GuardedReader
from octstage.storage.locations import Location, RemoteConfig

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

META_SHA1 = "source-sha1"
META_CRC32C = "source-sha1-crc32c"
READ_CHUNK = 8 * 1024 * 1024
POOL_SIZE = 64
# What a failed request can raise once the client's own retries are spent (OSError: transport).
ERRORS = (gexc.GoogleAPIError, OSError, DataCorruption, InvalidResponse)
# Their DEBUG output can carry request headers; our -v must not turn that on.
for _name in ("google", "urllib3"):
    logging.getLogger(_name).setLevel(max(logging.getLogger(_name).level, logging.INFO))

_clients: dict[str, storage.Client] = {}
_clients_lock = threading.Lock()


def gcs_client(remote: RemoteConfig | None) -> storage.Client:
    """One client per remote (or for the defaults) per process; clients are thread-safe enough
    for our use (one HTTP session, independent requests)."""
    key = remote.name if remote is not None else ""
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _make_client(remote)
            _clients[key] = client
        return client


def _make_client(remote: RemoteConfig | None) -> storage.Client:
    credentials: Credentials | None = None
    options: dict[str, Any] = {}
    project: str | None = None
    if remote is not None:
        endpoint = remote.get("endpoint").rstrip("/")
        if endpoint:
            options["api_endpoint"] = endpoint.removesuffix("/storage/v1")
        project = remote.get("project_number") or None
        credentials = _credentials(remote)
    try:
        client = storage.Client(
            project=project or None, credentials=credentials, client_options=options or None
        )
    except (DefaultCredentialsError, ValueError, OSError) as exc:
        # The message can quote a credentials file path; the type is enough to act on.
        raise StorageError(f"cannot create a GCS client: {type(exc).__name__}") from None
    # requests keeps 10 connections per host by default; stage and verification use more
    # threads than that, and each extra one would reconnect (and log a warning) every time.
    adapter = HTTPAdapter(pool_connections=4, pool_maxsize=POOL_SIZE)
    for scheme in ("https://", "http://"):
        client._http.mount(scheme, adapter)
    return client


def _credentials(remote: RemoteConfig) -> Credentials | None:
    from google.auth.credentials import AnonymousCredentials
    from google.oauth2 import service_account

    if remote.flag("anonymous"):
        return AnonymousCredentials()  # type: ignore[no-untyped-call]
    if remote.get("service_account_file"):
        return cast(
            "Credentials",
            service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
                remote.get("service_account_file")
            ),
        )
    if remote.get("service_account_credentials"):
        info = json.loads(remote.get("service_account_credentials"))
        return cast(
            "Credentials",
            service_account.Credentials.from_service_account_info(info),  # type: ignore[no-untyped-call]
        )
    return None  # application default credentials


class _HashSink:
    """A write-only file that hashes what it is given."""

    def __init__(self) -> None:
        self.digest = hashlib.sha1()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.size += len(data)
        return len(data)


@dataclass(frozen=True)
class BlobState:
    """What a verification needs to pin: the exact generation and its checksums."""

    name: str
    size: int
    generation: int
    crc32c: str | None
    metadata: Mapping[str, str]


def _hex(b64: str | None) -> str | None:
    return base64.b64decode(b64).hex() if b64 else None


def verified_sha1(metadata: Mapping[str, str] | None, crc32c: str | None) -> str | None:
    """The recorded source SHA1, if it was recorded for exactly these bytes."""
    meta = metadata or {}
    sha1 = meta.get(META_SHA1)
    if sha1 and crc32c and meta.get(META_CRC32C) == crc32c:
        return sha1.lower()
    return None


class GcsStorage:
    """Objects under ``gs://bucket/prefix``."""

    def __init__(self, client: storage.Client, bucket: str, prefix: str = "") -> None:
        self.client = client
        self.bucket_name = bucket
        self.prefix = prefix.strip("/")
        self.url = f"gs://{bucket}/{self.prefix}".rstrip("/")
        self._bucket = client.bucket(bucket)

    @classmethod
    def from_location(cls, loc: Location) -> GcsStorage:
        return cls(gcs_client(loc.remote), loc.bucket, loc.prefix)

    def _full(self, name: str) -> str:
        return join_name(self.prefix, check_name(name))

    def _rel(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    def _fail(self, name: str, exc: Exception) -> StorageError:
        if isinstance(exc, gexc.NotFound):
            return ObjectNotFoundError(f"{self.url}/{name}: no such object")
        return StorageError(f"{self.url}/{name}: {type(exc).__name__}: {exc}")

    def _blobs(self, prefix: str) -> Sequence[Any]:
        # "root/" + prefix, so root "m" never matches a sibling "m2/...".
        full_prefix = f"{self.prefix}/{prefix}" if self.prefix else prefix
        try:
            blobs = list(self.client.list_blobs(self._bucket, prefix=full_prefix or None))
        except ERRORS as exc:
            raise self._fail(prefix, exc) from None
        # A name ending in "/" is a "folder" placeholder some tools create: not an object.
        return sorted((b for b in blobs if not b.name.endswith("/")), key=lambda b: b.name)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        for blob in self._blobs(prefix):
            yield ObjectInfo(
                name=self._rel(blob.name),
                size=int(blob.size or 0),
                sha1=verified_sha1(blob.metadata, blob.crc32c),
                md5=_hex(blob.md5_hash),
                version=str(blob.generation) if blob.generation else None,
            )

    def states(self, prefix: str = "") -> Sequence[BlobState]:
        """``state`` of every object under ``prefix``, from one listing (no call per object)."""
        return [
            BlobState(
                self._rel(b.name), int(b.size or 0), int(b.generation or 0), b.crc32c,
                b.metadata or {},
            )
            for b in self._blobs(prefix)
        ]  # fmt: skip

    def _get_blob(self, name: str) -> Any:
        """The object's current blob; StorageError naming it when it is missing or unreachable."""
        try:
            blob = self._bucket.get_blob(self._full(name))
        except ERRORS as exc:
            raise self._fail(name, exc) from None
        if blob is None:
            raise ObjectNotFoundError(f"{self.url}/{name}: no such object")
        return blob

    def state(self, name: str) -> BlobState:
        """Current generation, size, CRC32C and metadata of one object."""
        blob = self._get_blob(name)
        return BlobState(
            name, int(blob.size or 0), int(blob.generation or 0), blob.crc32c, blob.metadata or {}
        )

    def stat(self, name: str) -> ObjectInfo:
        blob = self._get_blob(name)
        return ObjectInfo(
            name,
            int(blob.size or 0),
            verified_sha1(blob.metadata, blob.crc32c),
            _hex(blob.md5_hash),
        )

    def open(
        self, name: str, chunk_size: int | None = None, generation: int | None = None
    ) -> BinaryIO:
        if generation is None:
            generation = self.state(name).generation
        blob = self._bucket.blob(self._full(name), generation=generation)
        # BlobReader buffers READ_CHUNK itself; another buffer on top only adds requests.
        return cast(
            BinaryIO,
            GuardedReader(
                blob.open("rb", chunk_size=chunk_size or READ_CHUNK),
                ERRORS,
                lambda exc: StorageError(
                    f"{self.url}/{name}: read failed: {type(exc).__name__}: {exc}"
                ),
            ),
        )

    def read_bytes(self, name: str) -> bytes:
        try:
            return bytes(self._bucket.blob(self._full(name)).download_as_bytes())
        except ERRORS as exc:
            raise self._fail(name, exc) from None

    def write_bytes(
        self, name: str, data: bytes, metadata: Mapping[str, str] | None = None
    ) -> None:
        blob = self._bucket.blob(self._full(name))
        if metadata:
            blob.metadata = dict(metadata)
        try:
            blob.upload_from_string(data, content_type="application/octet-stream")
        except ERRORS as exc:
            raise self._fail(name, exc) from None

    def delete(self, name: str) -> None:
        try:
            self._bucket.blob(self._full(name)).delete()
        except gexc.NotFound:
            return
        except ERRORS as exc:
            raise self._fail(name, exc) from None

    def sha1_of(self, state: BlobState) -> tuple[str, int]:
        """SHA1 and length of exactly the generation in ``state``, streamed (never on disk)."""
        sink = _HashSink()
        blob = self._bucket.blob(self._full(state.name), generation=state.generation)
        try:
            # One streaming GET (ranged reads cost a request per chunk); the client also checks
            # the transfer against GCS's own checksum.
            blob.download_to_file(sink)
        except ERRORS as exc:
            raise self._fail(state.name, exc) from None
        return sink.digest.hexdigest(), sink.size

    def record_source_sha1(self, state: BlobState, sha1: str) -> None:
        """Record a verified source SHA1 on the generation that was hashed (and only on it)."""
        blob = self._bucket.blob(self._full(state.name), generation=state.generation)
        # Keep rclone's keys (its modification time): a second mirror must still see it as equal.
        blob.metadata = {**state.metadata, META_SHA1: sha1, META_CRC32C: state.crc32c or ""}
        try:
            blob.patch(if_generation_match=state.generation)
        except gexc.PreconditionFailed:
            raise StorageError(
                f"{self.url}/{state.name}: replaced while being verified; not recorded"
            ) from None
        except ERRORS as exc:
            raise self._fail(state.name, exc) from None
