"""A cache root as the build sees it: a local folder or a bucket prefix, named by one URL.

Everything ``build-cache`` keeps goes through here: volumes (Cell Painting: fields), the per-key
records, the stored rejections, the source index, the QC sheet and the manifest. A worker opens
the same URL the driver was given (``--out gs://...``, ``s3://...`` or a folder that every
machine mounts), so workers that share no disk with the driver write where the driver reads.

Write order is what makes a cache consistent without renames: a volume's data objects, then its
metadata, then its record, and the manifest last of all. A record therefore always means a
complete volume, and a run killed in between leaves objects without a record that the next run
rewrites with identical bytes (the key is a hash of the source and the parameters). A local
folder keeps its atomic rename of the whole volume (``volumestore.write_volume``). A Cell
Painting field has no record: its group ``zarr.json``, uploaded after everything under it, is
what says it is complete (``has_field``), so a re-run keeps it instead of uploading it again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import zarr

from octstage import manifest as mf
from octstage.cache import volumestore
from octstage.cellpainting import fieldstore
from octstage.errors import ObjectNotFoundError, StorageError
from octstage.outputs import MANIFEST
from octstage.storage import LocalStorage, Storage, open_storage


class CacheStore:
    """The cache at ``url``; ``local`` is its folder when it is one (else None)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/") or url
        self.storage: Storage = open_storage(self.url)
        self.local: Path | None = (
            self.storage.root if isinstance(self.storage, LocalStorage) else None
        )

    def __repr__(self) -> str:
        return f"CacheStore({self.url!r})"

    def read_json(self, name: str) -> Any | None:
        """The parsed object, or None when it is missing, unreadable or not JSON: what it records
        is then redone (a record or rejection only ever saves work)."""
        try:
            return json.loads(self.storage.read_bytes(name))
        except (StorageError, ValueError):
            return None

    def write_json(self, name: str, doc: Any, indent: int | None = None) -> None:
        self.storage.write_bytes(name, (json.dumps(doc, indent=indent) + "\n").encode())

    def write_bytes(self, name: str, data: bytes) -> None:
        self.storage.write_bytes(name, data)

    def write_manifest(
        self, manifest: mf.Manifest, local: Path | None, form: str, rows: mf.Rows | None = None
    ) -> None:
        """The build's last write, in ``form`` ("json" or "table"): to the file ``local`` when
        one is named, and into the cache itself when it is a bucket or no file was named; the
        columnar form's item table before the header that names it. ``rows``: the items
        streamed (``mf.write``), not ``manifest``'s."""
        if local is not None:
            mf.write(manifest, local, form, rows)
        if self.local is not None and local is None:  # a folder: streamed to the file
            mf.write(manifest, self.local / MANIFEST, form, rows)
        elif self.local is None:

            def put(name: str, path: Path) -> None:
                self.write_bytes(name, path.read_bytes())

            self.write_bytes(MANIFEST, mf.header_bytes(manifest, form, put, rows))

    def write_volume(
        self,
        relpath: str,
        array: npt.NDArray[np.uint8],
        spacing_mm: tuple[float, float, float],
        attributes: Mapping[str, Any],
        chunks: tuple[int, int, int],
        clevel: int,
    ) -> str:
        """Store one volume (see the module doc for the order); returns its checksum."""
        if self.local is not None:
            return volumestore.write_volume(
                self.local, relpath, array, spacing_mm, attributes, chunks=chunks, clevel=clevel
            )
        self._upload(
            relpath,
            volumestore.encode_volume(
                relpath, array, spacing_mm, attributes, chunks=chunks, clevel=clevel
            ),
        )
        return volumestore.array_checksum(array)

    def write_field(
        self,
        relpath: str,
        array: npt.NDArray[np.uint8],
        channels: Sequence[str],
        attributes: Mapping[str, Any],
        chunk: int,
        clevel: int,
    ) -> str:
        """Store one Cell Painting field (``[C, Y, X]``) as ``write_volume`` stores a volume;
        a complete field already there (same cache key, same content) is kept, not rewritten.
        Returns its checksum."""
        if self.local is not None:
            return fieldstore.write_field(
                self.local, relpath, array, channels, attributes, chunk=chunk, clevel=clevel
            )
        if not self.has_field(relpath):
            self._upload(
                relpath,
                fieldstore.encode_field(
                    relpath, array, channels, attributes, chunk=chunk, clevel=clevel
                ),
            )
        return volumestore.array_checksum(array)

    def _upload(self, relpath: str, objects: list[tuple[str, bytes]]) -> None:
        """A group's objects under ``relpath``, one after the other in the order given (data,
        then metadata: see the module doc)."""
        for key, data in objects:
            self.storage.write_bytes(f"{relpath}/{key}", data)

    def has_volume(self, relpath: str) -> bool:
        """Whether the volume's metadata (written after its data) is there."""
        if self.local is not None:
            return (self.local / relpath / "0" / "zarr.json").is_file()
        try:
            self.storage.stat(f"{relpath}/zarr.json")
        except ObjectNotFoundError:
            return False
        return True

    def has_field(self, relpath: str) -> bool:
        """Whether a Cell Painting field is complete (the same test as ``has_volume``)."""
        return self.has_volume(relpath)

    def open_array(self, relpath: str) -> zarr.Array[Any]:
        """Array ``0`` of a stored volume, for reading (a bucket's is fetched whole)."""
        if self.local is not None:
            return zarr.open_array(store=str(self.local / relpath / "0"), mode="r")
        prefix = f"{relpath}/"
        objects = {
            o.name[len(prefix) :]: self.storage.read_bytes(o.name)
            for o in self.storage.list(prefix)
        }
        return volumestore.open_objects(objects)
