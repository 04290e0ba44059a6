"""One small storage interface with local, GCS, S3 and B2 backends.

``open_storage(url)`` picks a backend from the URL: a plain path or ``file://`` (local),
``gs://bucket/prefix`` (google-cloud-storage), ``s3://bucket/prefix`` (s3fs),
``b2://bucket/prefix`` (b2sdk). Object names are
always '/'-separated and relative to the URL's prefix. Cloud SDKs are imported only by their
backend module, and only when such a URL is opened.
"""

from __future__ import annotations

from octstage.storage.base import ObjectInfo, Storage, check_name, join_name, split_url
from octstage.storage.local import LocalStorage
from octstage.storage.locations import Location, parse_location

__all__ = [
    "LocalStorage",
    "ObjectInfo",
    "Storage",
    "check_name",
    "join_name",
    "open_location",
    "open_storage",
    "split_url",
]


def open_storage(url: str, anonymous: bool = False) -> Storage:
    """The backend for ``url`` (local path, ``file://``, ``gs://``, ``s3://`` or ``b2://``);
    ``anonymous``: an ``s3://`` bucket read unsigned, without credentials (a public bucket such
    as the Cell Painting Gallery's), whatever keys the environment holds."""
    if anonymous and url.startswith("s3://"):
        from octstage.storage.s3 import S3Storage

        return S3Storage.from_location(parse_location(url), anonymous=True)
    if url.startswith(("gs://", "s3://", "b2://")):
        return open_location(parse_location(url))
    return LocalStorage(url.removeprefix("file://"))


def open_location(loc: Location) -> Storage:
    """The backend for a parsed location (``locations.parse_location``), which may name
    an rclone remote (``gcs:bucket/prefix``, ``s3:bucket/prefix``); its credentials come
    from that remote."""
    if loc.kind == "gcs":
        from octstage.storage.gcs import GcsStorage

        return GcsStorage.from_location(loc)
    if loc.kind == "s3":
        from octstage.storage.s3 import S3Storage

        return S3Storage.from_location(loc)
    if loc.kind == "b2":
        from octstage.storage.b2 import B2Storage

        return B2Storage.from_location(loc)
    return LocalStorage(loc.prefix)
