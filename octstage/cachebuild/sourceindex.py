"""The SHA1s of sources already hashed, kept in ``CACHE/source-index.json`` so that a re-run
neither re-reads nor decodes an unchanged source.

Each entry is remembered under a fingerprint of the object (``fingerprint``: a local file's size
and mtime; a bucket object's size and listed hashes). An entry whose fingerprint no longer
matches is ignored and the source is hashed again (hashing is cheap, decoding is not); a store
that lists a verified SHA1 (B2's content SHA1, the ``source-sha1`` that ``octstage mirror``
records on GCS) needs no index at all. A missing or damaged index only costs re-hashing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from octstage.cache.store import CacheStore
from octstage.storage import LocalStorage, ObjectInfo, Storage

INDEX_NAME = "source-index.json"


@dataclass
class SourceIndex:
    """name -> (fingerprint, sha1) of sources already hashed; saved atomically, often."""

    cache: CacheStore
    entries: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def load(cls, cache: CacheStore) -> SourceIndex:
        try:
            data: Any = cache.read_json(INDEX_NAME)
            entries = {str(k): dict(v) for k, v in data["entries"].items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            entries = {}  # no index (or a damaged one): sources are simply hashed again
        return cls(cache, entries)

    def sha1(self, obj: ObjectInfo, fingerprint: str | None) -> str | None:
        """The SHA1 of the object's current bytes when known without reading them: remembered
        under the same fingerprint, or listed by the store as verified (then remembered)."""
        entry = self.entries.get(obj.name)
        if (
            fingerprint is not None
            and entry is not None
            and entry.get("fingerprint") == fingerprint
        ):
            return entry.get("sha1")
        if obj.sha1 is not None:
            self.remember(obj.name, fingerprint, obj.sha1)
            return obj.sha1
        return None

    def remember(self, name: str, fingerprint: str | None, sha1: str) -> None:
        if fingerprint is not None:
            self.entries[name] = {"fingerprint": fingerprint, "sha1": sha1}

    def save(self) -> None:
        doc = {"format": "octstage-source-index/1", "entries": dict(sorted(self.entries.items()))}
        self.cache.write_json(INDEX_NAME, doc)


def fingerprint(storage: Storage, obj: ObjectInfo) -> str | None:
    """What must be unchanged for a remembered SHA1 to still hold; None when nothing is known."""
    if isinstance(storage, LocalStorage):
        try:
            st = (storage.root / obj.name).stat()
        except OSError:
            return None  # gone since the listing: its task will say so
        return f"local:{st.st_size}:{st.st_mtime_ns}"
    if obj.sha1 or obj.md5:
        return f"listed:{obj.size}:{obj.sha1 or ''}:{obj.md5 or ''}"
    return None
