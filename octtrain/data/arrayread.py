"""Reading a cached uint8 array (an OCT volume, a Cell Painting field) at the codec's speed, and
never a fill value in place of a missing data object.

The trainer's one reader of octstage's Zarr v3 arrays: ``open_array(path, name)`` parses the
array's ``zarr.json`` (``data/zarr_layout.py``, once per array) and ``CachedArray.read(region)``
returns ``array[region]``, reading from disk only the chunks the region covers, located through
the shard index (one ``preadv`` per run of chunks stored next to each other, up to ``RUN_MAX``
bytes, into a buffer the thread keeps). Each chunk decodes with numcodecs' blosc (or zstd)
straight into its row of a second kept buffer holding the region's chunks side by side, and
one strided copy per piece (a whole array: one; a crop: at most 3 per axis, a partial first
chunk, the whole chunks, a partial last chunk) places them into the new output array. The
layout read is what octstage writes (``sharding_indexed`` shards whose inner codecs are
``bytes`` + ``blosc`` + ``crc32c``, or ``bytes`` + ``blosc`` in caches written before the
chunk checksum, and whose index is ``bytes`` + ``crc32c``), plus plain unsharded chunks
(``bytes``, an optional ``blosc`` / ``zstd``, an optional ``crc32c``); anything else is
refused with a DataError rather than misread. It starts no thread (fork-safe in DataLoader
workers) and blosc releases the GIL while it decodes.

Why a reader of its own, not zarr, zarrs or tensorstore. Measured on the 2-core shared dev
machine (zarr 3.1.6, zarrs 0.2.3, tensorstore 0.1.86, numcodecs 0.16.6), median CPU time of
one read against numcodecs' Blosc decoding the same chunk bytes from memory (the floor; one
blosc thread everywhere): zarr costs 3.8-5.6x that floor on a 5x256x256 or 5x1080x1080 Cell
Painting field and its 224 crop, and 2.1x on a 64x384x384 OCT volume (its asyncio machinery,
per read); the ``zarrs`` codec pipeline 1.5-2.0x (1.6-1.8x on OCT); tensorstore comes closest
(1.15-1.3x on fields, 1.4x on OCT) but aborts any forked child once the parent process has
used it ("fork() use detected"), and the trainer's DataLoader forks its workers after the main
process has read (validation, profiles): it cannot be the trainer's reader. This one reads a
5x256x256 field, its 224 crop and an OCT volume (``read_volume``) within 1.2x of the floor:
the last run of ``bench/bench_cellpainting_loader.py`` (which prints all three every run)
printed 1.15x, 1.18x and 1.16x, on the 2-core machine shared with three other jobs (load ~3),
where other runs of the same code printed 1.13-1.18x, 1.15-1.23x and 1.04-1.20x (and, for
a 5x1080x1080 field, 1.07x whole and 1.23x for a crop: a crop misses now and then). Its own
decode loop runs at the floor's speed; what is left over it is the one strided copy into the
output (rows of 64 or 128 bytes: ~0.07x), reading the chunk bytes from the page cache (~0.07x
for a volume; ~0.01x for a field), ~25 us of Python and syscalls per read (~0.05x of a
field's), and the new output array's memory.

A missing data object (a shard, or a plain chunk) is a DataError, never zeros: zarr reads an
absent object as the fill value, this reader refuses it. An inner chunk that the shard index
marks empty (both words 2**64-1: zarr writes no bytes for a chunk that is all fill value) is
the fill value, as the writer meant. A shard shorter than its index, an index whose crc32c
does not match, an entry that points outside its shard, a shard cut short while it is read, a
chunk whose crc32c does not match its bytes and a chunk that does not decode to its size are
DataErrors too ("does not decode"). The chunk's crc32c is what catches bytes altered in a way
blosc still decodes (a flipped literal byte decodes to a wrong value, not an error); it is
checked over the compressed bytes before they decode (~1 us per chunk, ~0.02x of a field's
decode). Every message names the array and points at ``octstage verify``.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import google_crc32c
import numcodecs.blosc
import numpy as np
import numpy.typing as npt
from numcodecs.zstd import Zstd

from octtrain.data.chunk_regions import Region, axis_pieces, axis_steps, region_of
from octtrain.data.zarr_layout import ADVICE, Layout, parse_layout
from octtrain.errors import DataError

INDEX_ENTRY_BYTES = 16  # a shard index holds (offset, length) as two uint64 per inner chunk
CRC_BYTES = 4
# The crc32c of any bytes followed by their own crc32c (little-endian, as zarr's codec appends
# it): exactly one 4-byte tail gives this value, so it checks a chunk's stored crc in one call.
CRC_RESIDUE = 0x48674BC7
EMPTY = 2**64 - 1  # an index entry of an inner chunk that was never written (all fill value)
RUN_MAX = 256 << 10  # a run read at once stops growing here: its chunks decode while cached
SCRATCH_MAX = 32 << 20  # bytes of decoded chunks up to which a thread keeps its buffer

Stored = tuple[int, int, int]  # a stored inner chunk: its offset, its length, its row


def blosc_into(data: Any, dest: npt.NDArray[np.uint8]) -> None:
    """Decode one blosc chunk into ``dest``; ValueError unless it decodes to exactly its size.
    blosc's 16-byte header holds the decoded size at bytes 4..8: a chunk that decodes to less
    than ``dest`` (a reused buffer) would otherwise leave stale bytes in place."""
    nbytes = int.from_bytes(data[4:8], "little") if len(data) >= 16 else -1
    if nbytes != dest.nbytes:
        raise ValueError(f"a chunk of {nbytes} bytes, not {dest.nbytes}")
    numcodecs.blosc.decompress(data, dest)


_SCRATCH = threading.local()


def scratch(nbytes: int, use: str) -> npt.NDArray[np.uint8]:
    """``nbytes`` of this thread's buffer for ``use`` ("stored": chunks as read, "decoded"),
    kept from read to read and grown as needed (a fresh one above ``SCRATCH_MAX``). Fresh
    buffers per read cost more than the loop they served: glibc unmaps the pages of a large
    free and maps them again, and two fresh 320 KiB buffers (a field's decoded chunks, the
    output) page-faulted for ~60-240 us a read (the field's decode: ~520 us); reading an OCT
    volume's 6.6 MiB of chunks into a fresh buffer cost ~0.2-0.6 ms more than into a kept one.
    Per thread, since loader threads read at once; a forked worker gets its own copy."""
    if nbytes > SCRATCH_MAX:
        return np.empty(nbytes, dtype=np.uint8)
    buf: npt.NDArray[np.uint8] | None = getattr(_SCRATCH, use, None)
    if buf is None or buf.nbytes < nbytes:
        buf = np.empty(nbytes, dtype=np.uint8)
        setattr(_SCRATCH, use, buf)
    return buf[:nbytes]


@dataclass
class CachedArray:
    """One cached array, opened (metadata parsed): ``read`` a region; ``bytes_read`` and
    ``objects_read`` count what its reads took from disk (data objects opened; bytes of chunks
    and shard indexes read)."""

    path: Path
    name: str  # how errors name the array (the item it is, and its path)
    layout: Layout
    bytes_read: int = 0
    objects_read: int = 0
    packed: bool = False  # a pack of fields: a read of one reads its part of the index alone
    # The chunk geometry, worked out once per open: a read of a crop costs tens of us of
    # Python besides its decode, and each of these was part of that.
    _grid: tuple[int, ...] = field(init=False, repr=False)  # inner chunks per shard, per axis
    _index_bytes: int = field(init=False, repr=False)
    _chunk_bytes: int = field(init=False, repr=False)
    _interleave: tuple[int, ...] = field(init=False, repr=False)
    _only_key: str | None = field(init=False, repr=False)  # the one data object, if one
    _root: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        lay = self.layout
        self._grid = tuple(math.ceil(o / i) for o, i in zip(lay.outer, lay.inner, strict=True))
        crc = CRC_BYTES if lay.index_crc else 0
        self._index_bytes = math.prod(self._grid) * INDEX_ENTRY_BYTES + crc
        self._chunk_bytes = math.prod(lay.inner)
        d = len(lay.shape)
        self._interleave = tuple(x for i in range(d) for x in (i, d + i))
        one = all(o >= s for o, s in zip(lay.outer, lay.shape, strict=True))
        self._root = os.fspath(self.path)
        self._only_key = lay.key_prefix + lay.separator.join("0" * d) if one else None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.layout.shape

    @property
    def tile(self) -> tuple[int, ...]:
        """A chunk's extent in the last two axes (what one decode yields of a channel)."""
        return self.layout.inner[-2:]

    def _error(self, what: str) -> DataError:
        return DataError(f"{self.name}: {what}; {ADVICE}")

    def region(self, key: Sequence[slice] | None) -> Region:
        """``key`` (slices with steps of 1, one per axis, or None: everything) inside the array."""
        return region_of(key, self.shape)

    def read(self, key: Sequence[slice] | None = None) -> npt.NDArray[np.uint8]:
        """``array[key]`` as a new uint8 array, reading only the chunks the region covers."""
        region = self.region(key)
        lay = self.layout
        out = np.empty([s.stop - s.start for s in region], dtype=np.uint8)
        zero = [0] * len(lay.shape)
        if self._only_key is not None:  # octstage's layout: one shard holds the array
            self._read_object(self._only_key, zero, region, out)
            return out
        for objects in itertools.product(*axis_steps(region, zero, lay.shape, lay.outer)):
            coords = [n for n, _, _ in objects]
            key_ = lay.key_prefix + lay.separator.join(map(str, coords))
            origin = [n * o for n, o in zip(coords, lay.outer, strict=True)]
            self._read_object(key_, origin, region, out)
        return out

    def _read_object(
        self, key: str, origin: list[int], region: Region, out: npt.NDArray[np.uint8]
    ) -> None:
        """Place the part of data object ``key`` (at ``origin``) that ``region`` covers."""
        try:
            fd = os.open(f"{self._root}/{key}", os.O_RDONLY)  # a str: no Path per read
        except FileNotFoundError:
            raise self._error(f"data object {key} is missing") from None
        except OSError as exc:
            raise self._error(f"data object {key} is unreadable ({exc})") from None
        self.objects_read += 1
        try:
            size = os.fstat(fd).st_size
            if self.layout.sharded:
                self._read_shard(fd, size, key, origin, region, out)
            else:
                data = os.pread(fd, size, 0)
                self.bytes_read += len(data)
                src, dst = self._overlap(origin, region)
                scratch = np.empty(self.layout.inner, dtype=np.uint8)
                self._decode(data, scratch, key)
                out[dst] = scratch[src]
        finally:
            os.close(fd)

    def _shard_index(
        self, fd: int, size: int, key: str, first: slice | None = None
    ) -> npt.NDArray[np.uint64]:
        """The (offset, length) entries of the shard open as ``fd``, one row per inner chunk
        in C order, its crc checked; with ``first`` (a range of the first axis's inner chunks:
        one field of a pack), only those entries, read alone: a contiguous run of the index in
        C order. Their crc cannot be checked without the whole index (a JUMP pack's is ~300
        KB, read per crop), so the entries come back numbered from ``first.start``; a damaged
        entry still cannot pass unseen: one pointing past the
        shard is refused, one pointing elsewhere inside it fails the chunk's own crc32c."""
        lay, index_bytes = self.layout, self._index_bytes
        if size < index_bytes:
            raise self._error(
                f"data object {key} is {size} bytes, shorter than its {index_bytes}-byte index"
            )
        at = size - index_bytes if lay.index_at_end else 0
        if first is not None and first.stop - first.start < self._grid[0]:
            per = math.prod(self._grid[1:]) * INDEX_ENTRY_BYTES
            raw = os.pread(fd, (first.stop - first.start) * per, at + first.start * per)
            self.bytes_read += len(raw)
            return np.frombuffer(raw, dtype="<u8").reshape(-1, 2)
        raw = os.pread(fd, index_bytes, at)
        self.bytes_read += len(raw)
        n = (index_bytes - (CRC_BYTES if lay.index_crc else 0)) // INDEX_ENTRY_BYTES
        body = raw[: n * INDEX_ENTRY_BYTES]
        if lay.index_crc and google_crc32c.value(body) != int.from_bytes(raw[-4:], "little"):
            raise self._error(f"data does not decode (shard {key}: index checksum mismatch)")
        return np.frombuffer(body, dtype="<u8").reshape(n, 2)

    def _read_shard(
        self,
        fd: int,
        size: int,
        key: str,
        origin: list[int],
        region: Region,
        out: npt.NDArray[np.uint8],
    ) -> None:
        """Decode the inner chunks of the shard open as ``fd`` that ``region`` covers side by
        side into one buffer (each straight into its place there), then copy their parts into
        ``out`` a few pieces at a time: one copy for a whole array, at most 3 per axis. A copy
        per chunk (from one chunk-sized buffer) cost ~0.1x of a field's decode with the Python
        around it; for a volume, decoding one chunk or one layer of chunks at a time and
        copying it at once (a smaller buffer, kept cached) measured 0.02-0.08x slower."""
        lay = self.layout
        box, counts, axes = [], [], []
        for s, o, e, c in zip(region, origin, lay.outer, lay.inner, strict=True):
            lo, hi = max(s.start - o, 0), min(s.stop - o, e)  # the region, in the shard
            first, n, pieces = axis_pieces(lo, hi, c, lo + o - s.start)
            box.append(slice(first, first + n))
            counts.append(n)
            axes.append(pieces)
        # A pack's field (fewer first-axis chunks than the shard holds): its entries alone.
        part = box[0] if self.packed else None
        index = self._shard_index(fd, size, key, part)
        entry_grid = self._grid
        if part is not None and len(index) < math.prod(entry_grid):
            entry_grid = (part.stop - part.start, *entry_grid[1:])
            box[0] = slice(0, part.stop - part.start)
        # The box's entries in C order, as Python ints: for tens of chunks, a loop over a list
        # costs less than the numpy calls that would vectorize it (~1 us each here).
        entries: list[list[int]] = index.reshape(*entry_grid, 2)[tuple(box)].reshape(-1, 2).tolist()
        stored: list[Stored] = []
        empty: list[int] = []
        for row, (start, length) in enumerate(entries):
            if start + length <= size:
                stored.append((start, length, row))
            elif start == EMPTY and length == EMPTY:
                empty.append(row)  # a chunk the writer left out: all fill value
            else:
                raise self._error(f"data does not decode (shard {key}: an entry past its end)")
        chunks = scratch(len(entries) * self._chunk_bytes, "decoded").reshape(len(entries), -1)
        for row in empty:
            chunks[row] = lay.fill
        # In the order the chunks are stored: one preadv per run of chunks stored next to each
        # other (zarr writes them in Morton order, so a crop's chunks come in a few runs): the
        # bytes of those chunks, no others.
        stored.sort()
        i = 0
        while i < len(stored):
            j, end = i + 1, stored[i][0] + stored[i][1]
            while j < len(stored) and stored[j][0] == end and end - stored[i][0] < RUN_MAX:
                end += stored[j][1]
                j += 1
            start = stored[i][0]
            run = scratch(end - start, "stored")
            if os.preadv(fd, [run.data], start) != end - start:
                raise self._error(f"data object {key} was cut short while read")
            self.bytes_read += end - start
            self._decode_chunks(run, start, stored[i:j], chunks, key)
            i = j
        grid = chunks.reshape(*counts, *lay.inner).transpose(self._interleave)
        for piece in itertools.product(*axes):
            src_at: tuple[slice, ...] = ()
            dst_at: tuple[slice, ...] = ()
            for chunk_part, out_part in piece:
                src_at += chunk_part
                dst_at += (out_part,)
            src = grid[src_at]
            # Each axis of this box of out split in two (chunks, part of each): a reshape that
            # is always a view of out, never a copy.
            out[dst_at].reshape(src.shape)[...] = src

    def _decode_chunks(
        self,
        run: npt.NDArray[np.uint8],
        base: int,
        stored: list[Stored],
        chunks: npt.NDArray[np.uint8],
        key: str,
    ) -> None:
        """Decode each chunk of ``stored`` (``run`` holds the shard from ``base`` on) into its
        row of ``chunks``, its crc32c checked first where the layout has one: the loop per
        chunk, kept lean."""
        buf = run.data
        if self.layout.codec != "blosc":
            for start, length, row in stored:
                data = buf[start - base : start - base + length]
                self._decode(data, chunks[row], key, start)
            return
        crc = self.layout.chunk_crc
        for start, length, row in stored:
            a = start - base
            if crc:
                # One call over the chunk and its stored crc (google_crc32c takes a numpy view,
                # not a memoryview: no copy): ~0.4 us a chunk less than comparing the two.
                if length < CRC_BYTES or google_crc32c.value(run[a : a + length]) != CRC_RESIDUE:
                    raise self._crc_error(key, start)
                length -= CRC_BYTES
            try:
                blosc_into(buf[a : a + length], chunks[row])
            except (RuntimeError, ValueError, TypeError) as exc:
                raise self._error(f"data does not decode (object {key}: {exc})") from None

    def _crc_error(self, key: str, start: int) -> DataError:
        return self._error(
            f"data does not decode (object {key}: the chunk at byte {start} fails its crc32c "
            "checksum: its bytes changed after they were written)"
        )

    def _overlap(
        self, at: Sequence[int], region: Region
    ) -> tuple[tuple[slice, ...], tuple[slice, ...]]:
        """Where the chunk at ``at`` (its origin) and ``region`` meet: in the chunk, in ``out``."""
        src, dst = [], []
        for a, c, s in zip(at, self.layout.inner, region, strict=True):
            lo, hi = max(a, s.start), min(a + c, s.stop)
            src.append(slice(lo - a, hi - a))
            dst.append(slice(lo - s.start, hi - s.start))
        return tuple(src), tuple(dst)

    def _decode(self, data: Any, dest: npt.NDArray[np.uint8], key: str, start: int = 0) -> None:
        """Decode one chunk's bytes (stored at byte ``start`` of object ``key``) into ``dest``
        (its exact size, or a DataError), its crc32c checked first where the layout has one."""
        codec = self.layout.codec
        if self.layout.chunk_crc:
            view = np.frombuffer(data, dtype=np.uint8)
            if view.nbytes < CRC_BYTES or google_crc32c.value(view) != CRC_RESIDUE:
                raise self._crc_error(key, start)
            data = data[: view.nbytes - CRC_BYTES]
        try:
            if codec == "blosc":
                blosc_into(data, dest)
            elif codec == "zstd":
                # Decoded apart and measured: a reused buffer must not keep a stale tail.
                raw = np.frombuffer(Zstd().decode(data), dtype=np.uint8)
                if raw.nbytes != dest.nbytes:
                    raise ValueError(f"a chunk of {raw.nbytes} bytes, not {dest.nbytes}")
                dest.reshape(-1)[:] = raw
            elif len(data) == dest.nbytes:
                dest.reshape(-1)[:] = np.frombuffer(data, dtype=np.uint8)
            else:
                raise ValueError(f"a raw chunk of {len(data)} bytes, not {dest.nbytes}")
        except (RuntimeError, ValueError, TypeError) as exc:
            raise self._error(f"data does not decode (object {key}: {exc})") from None


@dataclass
class PackedItem:
    """One field of a pack (octstage's ``build-cache --pack``): ``pack[index, :, :Y, :X]`` for
    its ``shape`` ``[C, Y, X]``, read as ``CachedArray.read`` reads an array of its own: only
    the chunks a region covers (a chunk is one field's channel tile, never two fields')."""

    array: CachedArray
    index: int
    shape: tuple[int, ...]

    @property
    def name(self) -> str:
        return self.array.name

    @property
    def tile(self) -> tuple[int, ...]:
        return self.array.tile

    def read(self, key: Sequence[slice] | None = None) -> npt.NDArray[np.uint8]:
        """``field[key]`` as a new uint8 array."""
        region = region_of(key, self.shape)
        out = self.array.read((slice(self.index, self.index + 1), *region))
        return out.reshape(out.shape[1:])


def open_item(path: Path, name: str, index: int, shape: Sequence[int]) -> PackedItem:
    """Field ``index`` (of ``shape``, the manifest's) of the pack whose array is at ``path``;
    a DataError naming ``name`` when the pack has no such place or the field does not fit it
    (a manifest of another build)."""
    array = open_array(path, name)
    array.packed = True
    pack = array.shape
    fits = (
        len(pack) == 4
        and 0 <= index < pack[0]
        and len(shape) == 3
        and shape[0] == pack[1]
        and shape[1] <= pack[2]
        and shape[2] <= pack[3]
    )
    if not fits:
        raise DataError(
            f"{name}: the manifest's field {index} of shape {list(shape)} is not in a pack of "
            f"shape {list(pack)} ([fields, C, Y, X]); {ADVICE}"
        )
    return PackedItem(array, index, tuple(int(s) for s in shape))


# Parsed layouts by their zarr.json (path, inode, size, mtime): a pack's zarr.json lists its
# members (~50 KB for 64 fields), and parsing it per read cost ~1 ms against a 224 crop's
# ~2.5 ms; a stat is ~2 us. A plain dict, emptied when full: no lock (forked loader workers).
_LAYOUTS: dict[tuple[str, int, int, int], Layout] = {}
LAYOUTS_KEPT = 256


def open_array(path: Path, name: str) -> CachedArray:
    """The array at ``path`` (its folder, holding ``zarr.json``); ``name`` prefixes every error.
    DataError when the metadata is missing, unreadable or not a layout read here. A metadata
    file parsed before and not changed since (same inode, size and mtime) is not parsed again."""
    meta_path = f"{os.fspath(path)}/zarr.json"
    try:
        st = os.stat(meta_path)
        key = (meta_path, st.st_ino, st.st_size, st.st_mtime_ns)
        layout = _LAYOUTS.get(key)
        if layout is not None:
            return CachedArray(path, name, layout)
        with open(meta_path, "rb") as f:
            meta = json.loads(f.read())
    except FileNotFoundError:
        raise DataError(f"{name}: not in the cache (no zarr.json); {ADVICE}") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{name}: array metadata unreadable ({exc}); {ADVICE}") from None
    try:
        layout = parse_layout(meta, name)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DataError(f"{name}: array metadata unreadable ({exc!r}); {ADVICE}") from None
    if len(_LAYOUTS) >= LAYOUTS_KEPT:
        _LAYOUTS.clear()
    _LAYOUTS[key] = layout
    return CachedArray(path, name, layout)
