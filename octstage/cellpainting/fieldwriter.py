"""Where a plate's built fields go: one OME-Zarr group each, or packs of K (``--pack K``).

``plate.build_plate`` calls one writer per plate, per field, from its pool's threads:
``plan`` (once, the plate's cache keys in order, before pass 2), ``stored`` (a field already in
the cache: its record, or None), ``write`` (store a new field; its record), ``close`` (once,
after pass 2; drops a pack left incomplete by a failed field: the plate is left out then and the
next run writes the pack again). A record (``Stored``) is what the manifest item needs: the
address (``zarr_path``, ``pack_index``), shape, checksum and intensity of the stored values.

``FieldWriter`` is the per-field form (``fieldstore``). ``PackWriter`` groups the plate's
fields in order into packs (``packstore.plan_packs``); a pack is named by its members' cache
keys, so a re-run keeps a complete pack (its ``zarr.json``, written after its shard, lists the
members' records: nothing else is read) and writes again any pack one of whose members changed.
A pack is written by the thread that brings its last member: for a folder, its shard is spooled
in a hidden folder beside it that is renamed into place once its ``zarr.json`` is written; for
a bucket, spooled in a local temporary file, then uploaded shard first, ``zarr.json`` last.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt

from octstage import manifest as mf
from octstage.cache.store import CacheStore
from octstage.cache.volumestore import array_checksum
from octstage.cellpainting import packstore
from octstage.cellpainting.fieldstore import field_relpath


@dataclass(frozen=True)
class Stored:
    """A field as stored: its address and what the manifest records of its values."""

    zarr_path: str
    pack_index: int | None
    shape: tuple[int, int, int]
    checksum: str
    intensity: mf.Intensity | None


class FieldWriter:
    """One OME-Zarr group per field (``fields/<plate>/<key>.ome.zarr``): the default form."""

    def __init__(self, cache: CacheStore, plate: str, chunk: int, clevel: int) -> None:
        self.cache, self.plate, self.chunk, self.clevel = cache, plate, chunk, clevel

    def plan(self, keys: Sequence[str]) -> None:
        """Nothing to plan: each field is its own array."""

    def stored(self, key: str) -> Stored | None:
        rel = field_relpath(self.plate, key)
        if not self.cache.has_field(rel):
            return None
        values = np.asarray(self.cache.open_array(rel)[...])
        shape = (values.shape[0], values.shape[1], values.shape[2])
        intensity = mf.Intensity.of(values, channels_first=True)
        return Stored(rel, None, shape, array_checksum(values), intensity)

    def write(
        self, key: str, item_id: str, array: npt.NDArray[np.uint8], channels: Sequence[str]
    ) -> Stored:
        rel = field_relpath(self.plate, key)
        checksum = self.cache.write_field(
            rel, array, channels, {"item_id": item_id}, self.chunk, self.clevel
        )
        shape = (array.shape[0], array.shape[1], array.shape[2])
        return Stored(rel, None, shape, checksum, mf.Intensity.of(array, channels_first=True))

    def close(self) -> None:
        """Nothing held."""


@dataclass
class _Pack:
    relpath: str
    keys: list[str]
    spool: packstore.Spool | None = None
    folder: Path | None = None  # a local cache's hidden folder the shard is spooled in
    members: dict[int, dict[str, Any]] | None = None
    records: dict[int, dict[str, Any]] | None = None  # every member written this run
    existing: dict[str, dict[str, Any]] | None = None  # a complete pack's members (None: unread)


class PackWriter:
    """The plate's fields in packs of ``size`` (see the module docstring)."""

    def __init__(self, cache: CacheStore, plate: str, chunk: int, clevel: int, size: int) -> None:
        self.cache, self.plate, self.chunk, self.clevel, self.size = (
            cache,
            plate,
            chunk,
            clevel,
            size,
        )
        self._packs: list[_Pack] = []
        self._where: dict[str, tuple[int, int]] = {}  # cache key -> (pack, slot)
        self._lock = threading.Lock()

    def plan(self, keys: Sequence[str]) -> None:
        # Two fields of one cache key (the same source bytes) are one stored field, as in the
        # per-field form (the manifest's check reports the duplicate).
        keys = list(dict.fromkeys(keys))
        for members in packstore.plan_packs(len(keys), self.size):
            group = sorted(keys[i] for i in members)  # places in the name's order (pack_key)
            rel = packstore.pack_relpath(self.plate, packstore.pack_key(group))
            for slot, key in enumerate(group):
                self._where[key] = (len(self._packs), slot)
            self._packs.append(_Pack(rel, group))

    def _locate(self, key: str) -> tuple[_Pack, int]:
        if key not in self._where:
            raise ValueError(f"field {key}: not in the plate's plan")
        p, slot = self._where[key]
        return self._packs[p], slot

    def stored(self, key: str) -> Stored | None:
        pack, slot = self._locate(key)
        with self._lock:
            if pack.existing is None:
                meta = self.cache.read_json(f"{pack.relpath}/0/zarr.json")
                pack.existing = packstore.members_of(meta) if meta else {}
        member = pack.existing.get(key)
        # Its members at these very places, or it is written again (a pack of other places
        # would have each field read at another's).
        if member is None or list(pack.existing) != pack.keys:
            return None
        return _record(pack.relpath, slot, member)

    def write(
        self, key: str, item_id: str, array: npt.NDArray[np.uint8], channels: Sequence[str]
    ) -> Stored:
        pack, slot = self._locate(key)
        encoded = packstore.encode_field(array, self.chunk, self.clevel)
        shape = (array.shape[0], array.shape[1], array.shape[2])
        member = {
            "cache_key": key,
            "item_id": item_id,
            "channels": list(channels),
            "shape": list(shape),
            "checksum": array_checksum(array),
            "intensity": _intensity(mf.Intensity.of(array, channels_first=True)),
        }
        with self._lock:
            if pack.records is None:
                pack.records = {}
            if slot in pack.records:  # a second field of the same key: already stored
                return _record(pack.relpath, slot, pack.records[slot])
            if pack.spool is None:
                pack.spool = packstore.Spool(self._open(pack), len(pack.keys), self.chunk)
                pack.members = {}
            assert pack.members is not None
            pack.spool.add(slot, encoded)
            pack.members[slot] = pack.records[slot] = member
            done = pack.spool.full
        if done:
            self._finish(pack)
        return _record(pack.relpath, slot, member)

    def _open(self, pack: _Pack) -> BinaryIO:
        """Where the pack's shard is spooled: in place (a folder), or a local temporary file."""
        if self.cache.local is None:
            return tempfile.TemporaryFile(prefix="octstage-pack-")
        final = self.cache.local / pack.relpath
        pack.folder = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
        shard = pack.folder / "0" / packstore.SHARD_KEY
        shard.parent.mkdir(parents=True, exist_ok=True)
        return open(shard, "wb")

    def _finish(self, pack: _Pack) -> None:
        """The pack's index, then its ``zarr.json``: the shard first, the metadata last."""
        spool, members = pack.spool, pack.members
        assert spool is not None and members is not None
        spool.finish()
        meta = packstore.pack_metadata(
            spool.shape(), self.chunk, self.clevel, [members[i] for i in range(len(pack.keys))]
        )
        out = spool.out
        try:
            if pack.folder is None:
                out.seek(0)
                self.cache.write_bytes(f"{pack.relpath}/0/{packstore.SHARD_KEY}", out.read())
                self.cache.write_bytes(f"{pack.relpath}/0/zarr.json", meta)
            else:
                out.flush()
                os.fsync(out.fileno())
                (pack.folder / "0" / "zarr.json").write_bytes(meta)
                _fsync(pack.folder / "0" / "zarr.json")
                self._rename(pack.folder, pack.folder.parent / Path(pack.relpath).name)
        finally:
            out.close()
            pack.spool = None
            pack.members = None
            if pack.folder is not None:
                shutil.rmtree(pack.folder, ignore_errors=True)
            pack.folder = None

    @staticmethod
    def _rename(tmp: Path, final: Path) -> None:
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "0" / "zarr.json").is_file():
                raise
            # An earlier run wrote the same members (the name is their keys): identical.

    def close(self) -> None:
        """Drop the packs a failed field left incomplete (their fields are not in the manifest)."""
        for pack in self._packs:
            if pack.spool is not None:
                pack.spool.out.close()
                pack.spool = None
            if pack.folder is not None:
                shutil.rmtree(pack.folder, ignore_errors=True)
                pack.folder = None


def writer_for(
    cache: CacheStore, plate: str, chunk: int, clevel: int, pack: int
) -> FieldWriter | PackWriter:
    """The plate's writer: per field (``pack`` 0 or 1), else packs of ``pack`` fields."""
    if pack > 1:
        return PackWriter(cache, plate, chunk, clevel, pack)
    return FieldWriter(cache, plate, chunk, clevel)


def _intensity(stats: mf.Intensity) -> dict[str, list[float]]:
    return {"mean": list(stats.mean), "std": list(stats.std)}


def _record(relpath: str, slot: int, member: dict[str, Any]) -> Stored:
    shape = tuple(int(s) for s in member["shape"])
    stats = member.get("intensity")
    intensity = (
        None
        if stats is None
        else mf.Intensity(tuple(stats["mean"]), tuple(stats["std"]))  # as written
    )
    return Stored(relpath, slot, (shape[0], shape[1], shape[2]), str(member["checksum"]), intensity)


def _fsync(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())
