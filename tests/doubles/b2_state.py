"""The B2 double's state: b2sdk's simulator, widened, plus faults, counters and a name index.

``B2State`` holds everything the HTTP front (``b2_server.py``) serves and everything tests set
up directly (``put`` seeds objects without HTTP, fast enough for 25,000 objects).
"""

from __future__ import annotations

import bisect
import hashlib
import io
import itertools
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from b2sdk._internal.raw_api import ALL_CAPABILITIES
from b2sdk._internal.raw_simulator import (
    BucketSimulator,
    FileSimulator,
    KeySimulator,
    RawSimulator,
)
from b2sdk.v2 import SSE_NONE

API_URL = RawSimulator.API_URL
MiB = 1024 * 1024


class WideBucketSimulator(BucketSimulator):  # type: ignore[misc]
    """A bucket whose counters do not run out: ids keep 9 digits (so they sort as strings)."""

    FIRST_FILE_NUMBER = 999_999_999
    FIRST_FILE_ID = str(FIRST_FILE_NUMBER)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.upload_url_counter = itertools.count()
        self.file_id_counter = iter(range(self.FIRST_FILE_NUMBER, 100_000_000, -1))
        # Millisecond timestamps that only increase, like B2's upload timestamps.
        self.upload_timestamp_counter = itertools.count(int(time.time() * 1000))


class WideRawSimulator(RawSimulator):  # type: ignore[misc]
    BUCKET_SIMULATOR_CLASS = WideBucketSimulator


@dataclass
class Fault:
    """Answer the next ``count`` matching requests with HTTP ``status`` instead of serving them.

    ``op`` is a B2 API name (``b2_list_file_names``...), ``download`` or ``upload``; ``name``
    restricts a download fault to one object.
    """

    op: str
    status: int
    count: int = 1
    name: str | None = None
    served: int = 0


@dataclass
class Stats:
    """What the double has served so far."""

    calls: Counter[str] = field(default_factory=Counter)
    downloaded_bytes: int = 0
    faults_served: int = 0
    corrupted_served: int = 0


class _Index:
    """Sorted names of the visible (latest, not hidden) files of one bucket."""

    def __init__(self, bucket: BucketSimulator) -> None:
        latest: dict[str, FileSimulator] = {}
        # Keys are (name, id); ids count down, so the first key of a name is its newest version.
        for (name, _fid), sim in sorted(bucket.file_name_and_id_to_file.items()):
            if name not in latest:
                latest[name] = sim
        self.files = {n: s for n, s in latest.items() if s.is_visible()}
        self.names = sorted(self.files)


class B2State:
    """The simulator and the knobs tests turn (faults, corruption, delays, counters)."""

    def __init__(
        self,
        *,
        recommended_part_size: int = 100 * MiB,
        minimum_part_size: int = 5 * MiB,
        key_id: str | None = None,
        key: str | None = None,
    ) -> None:
        self.sim = WideRawSimulator()
        self.account_id, _master = self.sim.create_account()
        # A distinctive key pair, so a leak is easy to spot in any output.
        self.key_id = key_id or f"b2kid{secrets.token_hex(10)}"
        self.key = key or f"K00b2key{secrets.token_hex(14)}"
        self.sim.key_id_to_key[self.key_id] = KeySimulator(
            account_id=self.account_id,
            name="octstage-test",
            application_key_id=self.key_id,
            key=self.key,
            capabilities=ALL_CAPABILITIES,
            expiration_timestamp_or_none=None,
            buckets_or_none=None,
            name_prefix_or_none=None,
        )
        self.recommended_part_size = recommended_part_size
        self.minimum_part_size = minimum_part_size
        self.lock = threading.RLock()
        self.stats = Stats()
        self.faults: list[Fault] = []
        self.corrupt: Counter[str] = Counter()
        self.download_delay = 0.0
        self.issued_tokens: list[str] = []
        self._indexes: dict[str, _Index] = {}
        self._upload_urls: dict[str, str] = {}
        self._token = self._authorize()

    def secrets(self) -> list[str]:
        """Every credential string: the key pair and each auth token issued so far."""
        with self.lock:
            return [self.key_id, self.key, *self.issued_tokens]

    # -- state, directly (fast seeding; no HTTP) ------------------------------------------------
    def create_bucket(self, name: str) -> str:
        with self.lock:
            result = self.sim.create_bucket(
                API_URL, self._token, self.account_id, name, "allPrivate"
            )
            # No server-side encryption: keeps download headers plain, like a default bucket.
            self.sim.bucket_name_to_bucket[name].default_server_side_encryption = SSE_NONE
            return str(result["bucketId"])

    def put(
        self,
        bucket: str,
        name: str,
        data: bytes,
        *,
        sha1: bool = True,
        large: bool = False,
        mtime_ms: int | None = None,
    ) -> None:
        """Store an object. ``large`` stores it as B2 large files are (SHA1 only in
        ``large_file_sha1`` file info); ``sha1=False`` stores a large file with no SHA1 at all."""
        info = {"src_last_modified_millis": str(mtime_ms or int(time.time() * 1000))}
        with self.lock:
            bsim = self.sim.bucket_name_to_bucket[bucket]
            digest = hashlib.sha1(data).hexdigest()
            if large or not sha1:
                if sha1:
                    info["large_file_sha1"] = digest
                start = bsim.start_large_file(self._token, name, "application/octet-stream", info)
                fid = start["fileId"]
                self.sim.file_id_to_bucket_id[fid] = bsim.bucket_id
                bsim.upload_part(fid, 1, len(data), digest, io.BytesIO(data))
                bsim.finish_large_file(self._token, fid, [digest])
            else:
                upload = bsim.get_upload_url(self._token)
                result = bsim.upload_file(
                    upload["uploadUrl"],
                    upload["authorizationToken"],
                    name,
                    len(data),
                    "application/octet-stream",
                    digest,
                    info,
                    io.BytesIO(data),
                )
                self.sim.file_id_to_bucket_id[result["fileId"]] = bsim.bucket_id
            self._indexes.pop(bucket, None)

    def read(self, bucket: str, name: str) -> bytes:
        with self.lock:
            sim = self._index(bucket).files[name]
            return bytes(sim.data_bytes)

    def names(self, bucket: str) -> list[str]:
        with self.lock:
            return list(self._index(bucket).names)

    def inject(self, op: str, status: int, count: int = 1, name: str | None = None) -> Fault:
        fault = Fault(op, status, count, name)
        with self.lock:
            self.faults.append(fault)
        return fault

    def corrupt_downloads(self, name: str, count: int = 1) -> None:
        """Serve the next ``count`` downloads of ``name`` with one byte flipped (same size)."""
        with self.lock:
            self.corrupt[name] += count

    # -- internals -----------------------------------------------------------------------------
    def _authorize(self) -> str:
        with self.lock:
            result = self.sim.authorize_account(API_URL, self.key_id, self.key)
            token = str(result["authorizationToken"])
            self.issued_tokens.append(token)
            return token

    def _index(self, bucket_name: str) -> _Index:
        index = self._indexes.get(bucket_name)
        if index is None:
            index = _Index(self.sim._get_bucket_by_name(bucket_name))
            self._indexes[bucket_name] = index
        return index

    def _bucket_name(self, bucket_id: str) -> str:
        return str(self.sim._get_bucket_by_id(bucket_id).bucket_name)

    def take_fault(self, op: str, name: str | None = None) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.op == op and fault.served < fault.count:
                    if fault.name is not None and fault.name != name:
                        continue
                    fault.served += 1
                    self.stats.faults_served += 1
                    return fault
        return None

    def list_file_names(
        self,
        bucket_id: str,
        start: str | None,
        count: int,
        prefix: str,
        delimiter: str | None,
    ) -> dict[str, Any]:
        """B2 ``b2_list_file_names``, with folders when ``delimiter`` is given."""
        with self.lock:
            index = self._index(self._bucket_name(bucket_id))
            names = index.names
            pos = bisect.bisect_left(names, max(start or "", prefix))
            files: list[dict[str, Any]] = []
            next_name: str | None = None
            while pos < len(names):
                name = names[pos]
                if not name.startswith(prefix):
                    break
                if len(files) == count:
                    next_name = name
                    break
                cut = name.find(delimiter, len(prefix)) if delimiter else -1
                if cut >= 0:
                    folder = name[: cut + len(delimiter or "")]
                    files.append(_folder_entry(folder))
                    # Skip everything inside that folder: its names sort before folder + chr(max).
                    pos = bisect.bisect_left(names, folder + "\U0010ffff", pos)
                    continue
                files.append(index.files[name].as_list_files_dict(self._token))
                pos += 1
            return {"files": files, "nextFileName": next_name}


def _folder_entry(name: str) -> dict[str, Any]:
    return {
        "action": "folder",
        "fileName": name,
        "fileId": None,
        "contentLength": 0,
        "contentSha1": None,
        "contentType": None,
        "fileInfo": {},
        "uploadTimestamp": 0,
    }
