"""Amazon S3 (and S3-compatible) backend on s3fs: ``s3://bucket/prefix``.

Everything but the settings is ``FsspecStorage``. s3fs is made with its listing cache off (a
listing must see what another process wrote a moment ago) and with the credentials from
``locations.s3_credentials``: the location's rclone s3 remote or the standard AWS variables,
else botocore's own chain (profile, instance role).

``ObjectInfo.md5`` is the ETag when the ETag is an MD5: for objects uploaded in one part. A
multipart ETag (``<md5 of md5s>-<parts>``) is no content hash and gives ``None``. S3 also
documents that SSE-KMS / SSE-C objects have ETags that are not MD5s; a listing cannot tell, so
octstage uses ``md5`` only as a change stamp (build-cache's "unchanged since last run"), never
to prove bytes correct. S3 has no SHA1 of its own, so ``sha1`` is always ``None``.

A PUT (or a completed multipart upload) makes an object visible whole, so writes are atomic.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from s3fs import S3FileSystem

from octstage.storage.fsspec_store import FsspecStorage
from octstage.storage.locations import Location, S3Credentials, s3_credentials

_MD5_RE = re.compile(r"^[0-9a-f]{32}$")
# botocore's DEBUG output includes signed request headers (the access key id among them).
for _name in ("botocore", "aiobotocore", "s3fs", "urllib3"):
    logging.getLogger(_name).setLevel(max(logging.getLogger(_name).level, logging.INFO))


def etag_md5(etag: str | None) -> str | None:
    """The MD5 a single-part ETag is; None for a multipart ETag (``...-N``) or anything else."""
    value = (etag or "").strip().strip('"').lower()
    return value if _MD5_RE.match(value) else None


def s3_filesystem(creds: S3Credentials) -> S3FileSystem:
    """An s3fs filesystem for these credentials (fsspec reuses one per distinct settings)."""
    client_kwargs: dict[str, Any] = {}
    if creds.region:
        client_kwargs["region_name"] = creds.region
    return S3FileSystem(
        key=creds.key_id or None,
        secret=creds.secret or None,
        token=creds.token or None,
        anon=creds.anonymous,
        endpoint_url=creds.endpoint or None,
        client_kwargs=client_kwargs,
        use_listings_cache=False,
    )


class S3Storage(FsspecStorage):
    """Objects under ``s3://bucket/prefix``."""

    scheme = "s3"
    errors = (OSError, ValueError, BotoCoreError, ClientError)

    @classmethod
    def from_location(cls, loc: Location, anonymous: bool = False) -> S3Storage:
        creds = s3_credentials(loc)
        if anonymous:  # unsigned requests; the endpoint and region still come from the settings
            creds = S3Credentials("", "", "", creds.endpoint, creds.region, anonymous=True)
        return cls(s3_filesystem(creds), loc.bucket, loc.prefix, secrets=creds.secrets())

    def md5_of(self, info: Mapping[str, Any]) -> str | None:
        return etag_md5(info.get("ETag"))

    def version_of(self, info: Mapping[str, Any]) -> str | None:
        # The ETag changes with the bytes (multipart ones too); the time with every rewrite.
        etag = str(info.get("ETag") or "").strip('"')
        modified = info.get("LastModified")
        return f"{etag}@{modified}" if etag else None

    def is_missing_bucket(self, exc: BaseException) -> bool:
        # s3fs turns NoSuchBucket into FileNotFoundError; the botocore error is its cause.
        cause = exc if isinstance(exc, ClientError) else exc.__cause__
        return isinstance(cause, ClientError) and (
            cause.response.get("Error", {}).get("Code") == "NoSuchBucket"
        )

    def write_options(self, metadata: Mapping[str, str]) -> dict[str, Any]:
        return {"Metadata": dict(metadata)} if metadata else {}
