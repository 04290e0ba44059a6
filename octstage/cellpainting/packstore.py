"""Cell Painting fields packed for object stores: K fields in one Zarr v3 array ``[K, C, Y, X]``.

A per-field cache is three objects a field (group and array ``zarr.json``, one shard): a million
fields is three million requests to stage. A pack is two objects for K fields: the array's
``zarr.json`` and one shard (``sharding_indexed``) holding every field's chunks, so a cache of N
fields is about ``2 N / K`` objects. Layout under the cache root:
``packs/<plate>/<pack_key>.pack.zarr/0/`` (``zarr.json``, ``c/0/0/0/0``); a manifest item
addresses its field by that folder (``zarr_path``, the data in its array ``0`` as for a
per-field item) and its place on the first axis (``pack_index``).

Chunks are ``[1, C, chunk, chunk]``: one field's channel tile, never spanning fields, with the
per-field form's inner codecs (``bytes`` + blosc-zstd + ``crc32c``, ``volumestore.chunk_codecs``),
so a crop reads and decodes exactly the chunks it did before. The shard's index is in C order,
field first: one field's entries are one contiguous run of it (the trainer reads that run alone).

Fields of different sizes share a pack padded to the largest (``Y``, ``X`` the members'
maxima), not split by shape: the padding costs nothing stored (a chunk wholly outside a field
is never written: its index entry is "empty", read as fill value), a plate's fields are one
shape in practice (one microscope), and grouping by shape would leave a partial pack per shape
and plate. Each field's true ``[C, Y, X]`` is in the manifest and in the pack's attributes
(``octstage_pack``: per member its cache key, shape, checksum and intensity), which is how a
re-run build keeps a complete pack without reading its data.

Fields are encoded one at a time (``encode_field``: zarr writes the field alone, unsharded,
into memory; its chunk objects are the inner chunks' bytes), their chunks appended to a spool
file as they come (``Spool``, any order: the index says where each chunk is), the index and its
crc32c appended when the pack's last member arrives, and ``zarr.json`` written after the shard:
memory is one field, not K.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import google_crc32c
import numpy as np
import numpy.typing as npt
import zarr
from zarr.codecs import BloscShuffle
from zarr.core.buffer import Buffer
from zarr.storage import MemoryStore

from octstage.cache.volumestore import (
    CHANGED_BYTES,
    array_checksum,
    chunk_codecs,
    crc_mismatch,
    refuse_irregular,
)
from octstage.errors import VerificationError

PACKS = "packs"  # the top folder of packed fields, beside the per-field form's ``fields``
SHARD_KEY = "c/0/0/0/0"  # the one data object of a pack's array (one shard covers it)
ATTRIBUTE = "octstage_pack"  # the pack array's attribute listing its members
EMPTY = 2**64 - 1  # a shard index entry of a chunk never written (zarr: all fill value)
# Fields per pack when --pack is given without a number: 2 objects per 64 fields is 0.031 a
# field; a JUMP field (5 x 1080 x 1080, ~3 MB stored) makes a ~200 MB object, one request to
# stage, under the multipart thresholds' pain and well inside a loader's page cache.
DEFAULT_PACK = 64
# A member as ``stage`` and ``verify`` check it: its place, shape and checksum (the manifest's).
Member = tuple[int, tuple[int, ...], str]
# Members' values read at once when checking a pack: a small field costs a zarr call (~1.7 ms)
# far more than its bytes, a 1,080 px field (5.8 MB) comes ~11 to a read.
READ_BYTES = 64 << 20


def pack_relpath(plate: str, key: str) -> str:
    """Where a pack lives, relative to the cache root (its array is ``<relpath>/0``)."""
    return f"{PACKS}/{plate}/{key}.pack.zarr"


def pack_key(member_keys: Sequence[str]) -> str:
    """A pack's name: a hash of its members' cache keys, sorted (same members, same pack, in
    whatever order a table lists them). Its members take their places in that sorted order
    (``fieldwriter.PackWriter.plan``), so one name always means one layout: a name of the keys
    in table order would have a re-run of the same fields in another order find the old pack
    under one name and read each field at another's place."""
    return hashlib.sha256(json.dumps(sorted(member_keys)).encode()).hexdigest()[:32]


def plan_packs(n: int, size: int) -> list[range]:
    """``n`` fields in ``ceil(n / size)`` packs of near-equal length (72 fields at 64: two of
    36, not 64 and 8: the same object count, and no pack a tail of a few fields)."""
    if n <= 0:
        return []
    count = math.ceil(n / size)
    bounds = [round(i * n / count) for i in range(count + 1)]
    return [range(a, b) for a, b in itertools.pairwise(bounds)]


@dataclass
class EncodedField:
    """One field's chunks as stored: ``(row, column)`` of the chunk grid -> bytes (a chunk all
    fill value is absent, as zarr writes none)."""

    shape: tuple[int, int, int]
    chunks: dict[tuple[int, int], bytes]


def encode_field(array: npt.NDArray[np.uint8], chunk: int, clevel: int) -> EncodedField:
    """The chunks ``[C, chunk, chunk]`` of one field encoded by zarr itself (so they decode
    under the pack's metadata exactly as a per-field array's inner chunks do)."""
    c, y, x = array.shape
    buffers: dict[str, Buffer] = {}
    zarr.create_array(
        store=MemoryStore(buffers),
        shape=array.shape,
        dtype=np.uint8,
        chunks=(c, chunk, chunk),
        compressors=chunk_codecs(clevel, BloscShuffle.bitshuffle),
        fill_value=0,
    )[...] = array
    chunks = {}
    for key, buf in buffers.items():
        parts = key.split("/")
        if parts[0] == "c" and len(parts) == 4:
            chunks[(int(parts[2]), int(parts[3]))] = buf.to_bytes()
    return EncodedField((c, y, x), chunks)


@dataclass
class Spool:
    """A pack's shard being written: members' chunks appended to ``out`` in any order, their
    places kept (``add``), then the index (``finish``)."""

    out: BinaryIO
    members: int
    chunk: int
    written: int = 0
    shapes: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    places: dict[int, dict[tuple[int, int], tuple[int, int]]] = field(default_factory=dict)

    def add(self, slot: int, encoded: EncodedField) -> None:
        """Append member ``slot``'s chunks (callers hold the pack's lock)."""
        if slot in self.shapes:
            raise ValueError(f"pack member {slot} written twice")
        places = {}
        for rc, data in sorted(encoded.chunks.items()):
            self.out.write(data)
            places[rc] = (self.written, len(data))
            self.written += len(data)
        self.shapes[slot], self.places[slot] = encoded.shape, places

    @property
    def full(self) -> bool:
        return len(self.shapes) == self.members

    def shape(self) -> tuple[int, int, int, int]:
        """The pack array's ``[K, C, Y, X]``: the members' largest sizes."""
        c = {s[0] for s in self.shapes.values()}
        if len(c) != 1:
            raise ValueError(f"pack members of {sorted(c)} channels")
        y = max(s[1] for s in self.shapes.values())
        x = max(s[2] for s in self.shapes.values())
        return self.members, c.pop(), y, x

    def finish(self) -> int:
        """Append the shard index (C order over ``[K, 1, rows, columns]`` of chunks, then its
        crc32c, as zarr's ``sharding_indexed`` with its default index codecs reads it); the
        shard's size."""
        k, _, y, x = self.shape()
        rows, cols = -(-y // self.chunk), -(-x // self.chunk)
        index = np.full((k, rows, cols, 2), EMPTY, dtype="<u8")
        for slot, places in self.places.items():
            for (r, c), (offset, length) in places.items():
                index[slot, r, c] = (offset, length)
        body = index.tobytes()
        self.out.write(body)
        self.out.write(google_crc32c.value(body).to_bytes(4, "little"))
        return self.written + len(body) + 4


def pack_metadata(
    shape: tuple[int, int, int, int], chunk: int, clevel: int, members: list[dict[str, Any]]
) -> bytes:
    """The pack array's ``zarr.json`` (zarr writes it: no data), members in its attributes."""
    k, c, y, x = shape
    buffers: dict[str, Buffer] = {}
    zarr.create_array(
        store=MemoryStore(buffers),
        shape=shape,
        dtype=np.uint8,
        chunks=(1, c, chunk, chunk),
        shards=(k, c, -(-y // chunk) * chunk, -(-x // chunk) * chunk),
        compressors=chunk_codecs(clevel, BloscShuffle.bitshuffle),
        fill_value=0,
        dimension_names=("item", "c", "y", "x"),
        attributes={ATTRIBUTE: {"version": 1, "items": members}},
    )
    return buffers["zarr.json"].to_bytes()


def members_of(meta: Any) -> dict[str, dict[str, Any]]:
    """A pack's ``zarr.json`` (parsed) -> its members by cache key ({} when it lists none)."""
    try:
        items = meta["attributes"][ATTRIBUTE]["items"]
        return {str(m["cache_key"]): m for m in items}
    except (KeyError, TypeError):
        return {}


def open_pack(cache_root: Path, relpath: str) -> zarr.Array[Any]:
    """A stored pack's array, for reading; VerificationError when its metadata or its shard is
    gone (zarr would read a missing shard as fill values, every member as zeros), or when one
    of its files is a FIFO or device (reading it would block)."""
    refuse_irregular(cache_root, relpath)
    array = cache_root / relpath / "0"
    if not (array / "zarr.json").is_file():
        raise VerificationError(f"{relpath}: 0/zarr.json gone")
    if not (array / SHARD_KEY).is_file():
        raise VerificationError(f"{relpath}: data object 0/{SHARD_KEY} gone")
    return zarr.open_array(store=str(array), mode="r")


def _place_problem(shape4: tuple[int, ...], member: Member) -> str | None:
    """Why ``member`` has no place in a pack of ``shape4``, or None when it fits."""
    index, shape, _ = member
    k, c, y, x = (*shape4, 0, 0, 0, 0)[:4]
    if len(shape4) != 4 or not (0 <= index < k and len(shape) == 3 and shape[0] == c):
        return f"no field {index} of shape {list(shape)} in a pack of shape {list(shape4)}"
    if shape[1] > y or shape[2] > x:
        return f"field {index} of shape {list(shape)} does not fit a pack of shape {list(shape4)}"
    return None


def read_member(pack: zarr.Array[Any], relpath: str, member: Member) -> npt.NDArray[np.uint8]:
    """One member's values ``[C, Y, X]`` (the chunks it covers alone); VerificationError when
    the pack has no such place or the member does not fit it."""
    problem = _place_problem(pack.shape, member)
    if problem is not None:
        raise VerificationError(f"{relpath}: {problem}")
    index, shape, _ = member
    return np.asarray(pack[index, :, : shape[1], : shape[2]], dtype=np.uint8)


def _runs(members: Sequence[Member], field_bytes: int) -> list[list[int]]:
    """Positions in ``members``, grouped into runs of consecutive places of at most
    ``READ_BYTES`` together (a lone member when it alone is larger)."""
    order = sorted(range(len(members)), key=lambda n: members[n][0])
    runs: list[list[int]] = []
    for n in order:
        run = runs[-1] if runs else None
        if (
            run is not None
            and members[n][0] == members[run[-1]][0] + 1
            and (len(run) + 1) * field_bytes <= READ_BYTES
        ):
            run.append(n)
        else:
            runs.append([n])
    return runs


def member_values(
    pack: zarr.Array[Any], relpath: str, members: Sequence[Member]
) -> Iterator[tuple[int, npt.NDArray[np.uint8] | Exception]]:
    """``(position in members, values [C, Y, X] or why they could not be read)`` for every
    member, in place order. Runs of consecutive places are read in one call (a zarr read per
    member costs ~1.7 ms whatever its size: a million small fields would take half an hour);
    when a run's read fails, its members are read one by one, so the failure names only the
    member whose chunks are damaged. A member without a place in the pack gets a
    VerificationError naming it."""
    field_bytes = max(1, math.prod(pack.shape[1:]))
    for run in _runs(members, field_bytes):
        block: npt.NDArray[np.uint8] | None = None
        if len(run) > 1 and all(_place_problem(pack.shape, members[n]) is None for n in run):
            lo, hi = members[run[0]][0], members[run[-1]][0] + 1
            try:
                block = np.asarray(pack[lo:hi], dtype=np.uint8)
            except Exception:  # noqa: BLE001 - read each member to name the damaged one
                block = None
        for n in run:
            index, shape, _ = members[n]
            if block is not None:
                yield n, block[index - members[run[0]][0], :, : shape[1], : shape[2]]
                continue
            try:
                yield n, read_member(pack, relpath, members[n])
            except Exception as exc:  # noqa: BLE001 - the caller decides what a failure is
                worded = f"{relpath}: field {index} unreadable: {CHANGED_BYTES}"
                yield n, VerificationError(worded) if crc_mismatch(exc) else exc


def values_finding(values: npt.NDArray[np.uint8], member: Member) -> str | None:
    """Why a member's ``values`` differ from the manifest's checksum, or None."""
    actual = array_checksum(values)
    if actual != member[2]:
        return f"field {member[0]}: checksum {actual} != manifest {member[2]}"
    return None


def check_pack(cache_root: Path, relpath: str, members: Sequence[Member]) -> None:
    """Raise VerificationError unless the stored pack holds every member as the manifest says
    (at most ``READ_BYTES`` of members' values in memory at a time)."""
    pack = open_pack(cache_root, relpath)
    for n, values in member_values(pack, relpath, members):
        if isinstance(values, Exception):
            raise values
        finding = values_finding(values, members[n])
        if finding is not None:
            raise VerificationError(f"{relpath}: {finding}")
