"""Reading a cached uint8 array (an OCT volume, a Cell Painting field) at the codec's speed, and
never a fill value in place of a missing data object.

The trainer's one reader of octstage's Zarr v3 arrays: ``open_array(path, name)`` parses the
array's ``zarr.json`` and ``CachedArray.read(region)`` returns ``array[region]``, reading from
disk only the chunks the region covers, located through the shard index (one ``pread`` per run
of chunks stored next to each other; a read of a megabyte or more, a whole volume, decodes from
the mapped shard instead, sparing the copy), and decoding each with numcodecs' blosc (or zstd)
into one reused chunk buffer, then into place. The layout read is what octstage writes
(``sharding_indexed`` shards whose inner codecs are ``bytes`` + ``blosc`` and whose index is
``bytes`` + ``crc32c``), plus plain unsharded chunks (``bytes`` and an optional ``blosc`` /
``zstd``); anything else is refused with a DataError rather than misread. It starts no thread
(fork-safe in DataLoader workers) and blosc releases the GIL while it decodes.

Why a reader of its own, not zarr, zarrs or tensorstore. Measured on the 2-core shared dev
machine (zarr 3.1.6, zarrs 0.2.3, tensorstore 0.1.86, numcodecs 0.16.6), median CPU time of
one read against numcodecs' Blosc decoding the same chunk bytes from memory (the floor; one
blosc thread everywhere): zarr costs 3.8-5.6x that floor on a 5x256x256 or 5x1080x1080 Cell
Painting field and its 224 crop, and 2.1x on a 64x384x384 OCT volume (its asyncio machinery,
per read); the ``zarrs`` codec pipeline 1.5-2.0x (1.6-1.8x on OCT); tensorstore comes closest
(1.15-1.3x on fields, 1.4x on OCT) but aborts any forked child once the parent process has
used it ("fork() use detected"), and the trainer's DataLoader forks its workers after the main
process has read (validation, profiles): it cannot be the trainer's reader. This one reads a
field or crop at ~1.15x the floor and an OCT volume at ~1.2-1.3x (``bench/bench_cellpainting_
loader.py`` prints both on every run); what is left over the decode is the Python loop (~5 us
a chunk), placing each chunk into the output and the new output array's memory itself.

A missing data object (a shard, or a plain chunk) is a DataError, never zeros: zarr reads an
absent object as the fill value, this reader refuses it. An inner chunk that the shard index
marks empty (both words 2**64-1: zarr writes no bytes for a chunk that is all fill value) is
the fill value, as the writer meant. A shard shorter than its index, an index whose crc32c
does not match, an entry that points outside its shard and a chunk that does not decode to its
size are DataErrors too ("does not decode"). Every message names the array and points at
``octstage verify``.
"""

from __future__ import annotations

import itertools
import json
import math
import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import google_crc32c
import numcodecs.blosc
import numpy as np
import numpy.typing as npt
from numcodecs.zstd import Zstd

from octtrain.errors import DataError

ADVICE = "run `octstage verify` on the manifest, then rebuild or restage the cache"
INDEX_ENTRY_BYTES = 16  # a shard index holds (offset, length) as two uint64 per inner chunk
CRC_BYTES = 4
MAP_BYTES = 1 << 20  # chunks wanted from one shard above which it is mapped, not read
EMPTY = 2**64 - 1  # an index entry of an inner chunk that was never written (all fill value)

Region = tuple[slice, ...]
# A chunk to decode: its offset and length in the shard, its part, where that part goes in out.
Wanted = tuple[int, int, tuple[slice, ...], tuple[slice, ...]]


@dataclass(frozen=True)
class Layout:
    """What ``zarr.json`` says about where an array's chunks are and how they are encoded."""

    shape: tuple[int, ...]
    outer: tuple[int, ...]  # the chunk grid: one data object per outer chunk
    inner: tuple[int, ...]  # the decoded unit: the inner chunk of a shard, or the chunk itself
    sharded: bool
    codec: str  # "blosc", "zstd" or "none"
    index_crc: bool
    index_at_end: bool
    fill: int
    key_prefix: str  # "c/" (default encoding) or "" (v2 encoding)
    separator: str


def _refuse(where: str, what: str) -> DataError:
    return DataError(f"{where}: {what}; the trainer reads octstage's layout ({ADVICE})")


def _chunk_codec(codecs: Sequence[Any], where: str) -> str:
    names = [c.get("name") if isinstance(c, dict) else c for c in codecs]
    if not names or names[0] != "bytes" or len(names) > 2:
        raise _refuse(where, f"codecs {names} are not bytes + one compressor")
    codec = names[1] if len(names) == 2 else "none"
    if codec not in ("blosc", "zstd", "none"):
        raise _refuse(where, f"codec {codec!r} is not read here")
    return str(codec)


def parse_layout(meta: dict[str, Any], where: str) -> Layout:
    """The ``Layout`` of a Zarr v3 uint8 array's metadata; DataError for anything else."""
    if meta.get("zarr_format") != 3 or meta.get("node_type") != "array":
        raise _refuse(where, "not a Zarr v3 array")
    if meta.get("data_type") != "uint8":
        raise _refuse(where, f"data type {meta.get('data_type')!r} is not uint8")
    grid = meta.get("chunk_grid", {})
    if grid.get("name") != "regular":
        raise _refuse(where, f"chunk grid {grid.get('name')!r} is not regular")
    shape = tuple(int(s) for s in meta["shape"])
    outer = tuple(int(c) for c in grid["configuration"]["chunk_shape"])
    encoding = meta.get("chunk_key_encoding", {"name": "default"})
    enc_name = encoding.get("name")
    sep = encoding.get("configuration", {}).get("separator", "/" if enc_name == "default" else ".")
    if enc_name not in ("default", "v2"):
        raise _refuse(where, f"chunk key encoding {enc_name!r}")
    codecs = meta.get("codecs", [])
    fill = int(meta.get("fill_value") or 0)
    common = {"fill": fill, "key_prefix": "c/" if enc_name == "default" else "", "separator": sep}
    if codecs and codecs[0].get("name") == "sharding_indexed":
        if len(codecs) != 1:
            raise _refuse(where, "codecs after the sharding codec")
        conf = codecs[0]["configuration"]
        index = [c.get("name") for c in conf.get("index_codecs", [])]
        if index not in (["bytes"], ["bytes", "crc32c"]):
            raise _refuse(where, f"shard index codecs {index}")
        endian = conf["index_codecs"][0].get("configuration", {}).get("endian", "little")
        if endian != "little":
            raise _refuse(where, "a big-endian shard index")
        return Layout(
            shape=shape,
            outer=outer,
            inner=tuple(int(c) for c in conf["chunk_shape"]),
            sharded=True,
            codec=_chunk_codec(conf["codecs"], where),
            index_crc=index[-1] == "crc32c",
            index_at_end=conf.get("index_location", "end") == "end",
            **common,
        )
    return Layout(
        shape=shape,
        outer=outer,
        inner=outer,
        sharded=False,
        codec=_chunk_codec(codecs, where),
        index_crc=False,
        index_at_end=True,
        **common,
    )


Step = tuple[int, slice, slice]  # on one axis: a chunk's number, its part in the chunk, in out


def axis_steps(
    region: Region, origin: Sequence[int], extent: Sequence[int], chunk: Sequence[int]
) -> list[list[Step]]:
    """Per axis, the chunks of size ``chunk`` tiling the box at ``origin`` of ``extent`` that
    ``region`` (array coordinates) touches: their number in the box, the part of each that the
    region takes (in chunk coordinates) and where that part goes in the region's output."""
    axes = []
    for s, o, e, c in zip(region, origin, extent, chunk, strict=True):
        lo, hi = max(s.start, o), min(s.stop, o + e)  # the region's part of the box, this axis
        steps = []
        for n in range((lo - o) // c, (hi - 1 - o) // c + 1):
            a = o + n * c
            first, last = max(a, lo), min(a + c, hi)
            steps.append((n, slice(first - a, last - a), slice(first - s.start, last - s.start)))
        axes.append(steps)
    return axes


def strides(grid: Sequence[int]) -> list[int]:
    """C-order strides of a chunk grid: a chunk's place in the shard index."""
    out, step = [], 1
    for g in reversed(grid):
        out.append(step)
        step *= g
    return out[::-1]


class _Target(NamedTuple):
    """Where one read goes: its region, its output array and the chunk buffer it decodes into."""

    region: Region
    out: npt.NDArray[np.uint8]
    scratch: npt.NDArray[np.uint8]


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

    @property
    def shape(self) -> tuple[int, ...]:
        return self.layout.shape

    def _error(self, what: str) -> DataError:
        return DataError(f"{self.name}: {what}; {ADVICE}")

    def region(self, key: Sequence[slice] | None) -> Region:
        """``key`` (slices with steps of 1, one per axis, or None: everything) inside the array."""
        if key is None:
            return tuple(slice(0, s) for s in self.shape)
        if len(key) != len(self.shape):
            raise ValueError(f"{len(key)} slices for a {len(self.shape)}-d array")
        out = []
        for s, n in zip(key, self.shape, strict=True):
            start, stop, step = s.indices(n)
            if step != 1 or stop <= start:
                raise ValueError(f"slice {s} of an axis of {n}: need a non-empty step-1 slice")
            out.append(slice(start, stop))
        return tuple(out)

    def read(self, key: Sequence[slice] | None = None) -> npt.NDArray[np.uint8]:
        """``array[key]`` as a new uint8 array, reading only the chunks the region covers."""
        region = self.region(key)
        lay = self.layout
        out = np.empty([s.stop - s.start for s in region], dtype=np.uint8)
        # Every chunk decodes into this buffer, then is copied into place: a read allocates
        # two arrays, whatever its number of chunks (and concurrent reads share nothing).
        target = _Target(region, out, np.empty(lay.inner, dtype=np.uint8))
        zero = [0] * len(lay.shape)
        for objects in itertools.product(*axis_steps(region, zero, lay.shape, lay.outer)):
            coords = [n for n, _, _ in objects]
            key_ = lay.key_prefix + lay.separator.join(map(str, coords))
            self._read_object(key_, [n * o for n, o in zip(coords, lay.outer, strict=True)], target)
        return out

    def _read_object(self, key: str, origin: list[int], target: _Target) -> None:
        """Place the part of data object ``key`` (at ``origin``) that the target's region covers."""
        try:
            fd = os.open(self.path / key, os.O_RDONLY)
        except FileNotFoundError:
            raise self._error(f"data object {key} is missing") from None
        except OSError as exc:
            raise self._error(f"data object {key} is unreadable ({exc})") from None
        self.objects_read += 1
        try:
            size = os.fstat(fd).st_size
            if self.layout.sharded:
                self._read_shard(fd, size, key, origin, target)
            else:
                data = os.pread(fd, size, 0)
                self.bytes_read += len(data)
                src, dst = self._overlap(origin, target.region)
                self._decode(data, target.scratch, key)
                target.out[dst] = target.scratch[src]
        finally:
            os.close(fd)

    def _shard_index(self, fd: int, size: int, key: str, n: int) -> list[list[int]]:
        """The ``n`` (offset, length) entries of the shard open as ``fd``, its crc checked."""
        lay = self.layout
        index_bytes = n * INDEX_ENTRY_BYTES + (CRC_BYTES if lay.index_crc else 0)
        if size < index_bytes:
            raise self._error(
                f"data object {key} is {size} bytes, shorter than its {index_bytes}-byte index"
            )
        raw = os.pread(fd, index_bytes, size - index_bytes if lay.index_at_end else 0)
        self.bytes_read += len(raw)
        body = raw[: n * INDEX_ENTRY_BYTES]
        if lay.index_crc and google_crc32c.value(body) != int.from_bytes(raw[-4:], "little"):
            raise self._error(f"data does not decode (shard {key}: index checksum mismatch)")
        entries: list[list[int]] = np.frombuffer(body, dtype="<u8").reshape(n, 2).tolist()
        return entries

    def _read_shard(self, fd: int, size: int, key: str, origin: list[int], target: _Target) -> None:
        lay = self.layout
        grid = [math.ceil(o / i) for o, i in zip(lay.outer, lay.inner, strict=True)]
        index = self._shard_index(fd, size, key, math.prod(grid))
        out, region = target.out, target.region
        # Per axis, each chunk's share of its place in the index (number x stride), so that a
        # chunk's entry is the sum of its axes' shares: the loop below is per chunk, keep it lean.
        axes = [
            [(n * st, src, dst) for n, src, dst in steps]
            for steps, st in zip(
                axis_steps(region, origin, lay.outer, lay.inner), strides(grid), strict=True
            )
        ]
        wanted: list[Wanted] = []
        for steps in itertools.product(*axes):
            places, src, dst = zip(*steps, strict=True)
            offset, length = index[sum(places)]
            if offset == EMPTY and length == EMPTY:
                out[dst] = lay.fill  # a chunk the writer left out: all fill value
            elif offset + length > size:
                raise self._error(f"data does not decode (shard {key}: an entry past its end)")
            else:
                wanted.append((offset, length, src, dst))
        # One pread per run of chunks stored next to each other (zarr writes them in Morton
        # order, so a crop's chunks come in a few runs): the bytes of those chunks, no others.
        wanted.sort(key=lambda w: w[0])
        if sum(w[1] for w in wanted) >= MAP_BYTES:
            self._decode_mapped(fd, wanted, target, key)
            return
        i, scratch = 0, target.scratch
        while i < len(wanted):
            start = wanted[i][0]
            j, end = i + 1, start + wanted[i][1]
            while j < len(wanted) and wanted[j][0] == end:
                end += wanted[j][1]
                j += 1
            run = memoryview(os.pread(fd, end - start, start))
            self.bytes_read += len(run)
            for offset, length, src, dst in wanted[i:j]:
                self._decode(run[offset - start : offset - start + length], scratch, key)
                out[dst] = scratch[src]
            i = j

    def _decode_mapped(self, fd: int, wanted: list[Wanted], target: _Target, key: str) -> None:
        """Decode ``wanted`` chunks from the shard mapped into memory: for a read of megabytes
        (a whole volume) the copy ``pread`` makes into a fresh buffer was ~0.1x of the decode.
        A mapped file cut shorter while mapped would fault (SIGBUS) instead of raising; octstage
        never rewrites a shard in place (build and stage write a new file and rename it)."""
        out, scratch = target.out, target.scratch
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                for offset, length, src, dst in wanted:
                    chunk = view[offset : offset + length]
                    try:
                        self._decode(chunk, scratch, key)
                    finally:
                        chunk.release()  # an error's traceback holds it; the map must close
                    out[dst] = scratch[src]
                    self.bytes_read += length
            finally:
                view.release()

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

    def _decode(self, data: Any, scratch: npt.NDArray[np.uint8], key: str) -> None:
        """Decode one chunk's bytes into ``scratch`` (its exact size, or a DataError)."""
        codec = self.layout.codec
        try:
            if codec == "blosc":
                # blosc's 16-byte header holds the decoded size at bytes 4..8: a chunk that
                # decodes to less than the buffer would otherwise leave stale bytes in place.
                nbytes = int.from_bytes(data[4:8], "little") if len(data) >= 16 else -1
                if nbytes != scratch.nbytes:
                    raise ValueError(f"a chunk of {nbytes} bytes, not {scratch.nbytes}")
                numcodecs.blosc.decompress(data, scratch)
            elif codec == "zstd":
                Zstd().decode(data, scratch)
            elif len(data) == scratch.nbytes:
                scratch.reshape(-1)[:] = np.frombuffer(data, dtype=np.uint8)
            else:
                raise ValueError(f"a raw chunk of {len(data)} bytes, not {scratch.nbytes}")
        except (RuntimeError, ValueError, TypeError) as exc:
            raise self._error(f"data does not decode (object {key}: {exc})") from None


def open_array(path: Path, name: str) -> CachedArray:
    """The array at ``path`` (its folder, holding ``zarr.json``); ``name`` prefixes every error.
    DataError when the metadata is missing, unreadable or not a layout read here."""
    try:
        meta = json.loads((path / "zarr.json").read_bytes())
    except FileNotFoundError:
        raise DataError(f"{name}: not in the cache (no zarr.json); {ADVICE}") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{name}: array metadata unreadable ({exc}); {ADVICE}") from None
    try:
        layout = parse_layout(meta, name)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DataError(f"{name}: array metadata unreadable ({exc!r}); {ADVICE}") from None
    return CachedArray(path, name, layout)
