"""A pack's fields read straight from its shard: ``verify``'s way through the packs octstage
writes.

zarr reads a shard's inner chunks through its async codec pipeline at ~0.5 ms a chunk whatever
the chunk's size: a million small fields cost ten minutes of two cores before any checksum. A
pack as ``packstore`` writes it is one shard of ``[1, C, chunk, chunk]`` tiles with fixed
codecs (``bytes``, blosc, ``crc32c``; the index at the end, then its crc32c): ``fields`` reads
the index once, then each member's tiles with one ``pread`` each, checks every tile's crc32c and
decodes it with numcodecs' blosc (the library zarr's codec calls), so memory is one field.

This is a fast path, never a second opinion: metadata of another layout or codecs, an index
that fails its crc32c, an index entry outside the shard is ``None`` for the whole pack, and a
member with a tile that fails its crc32c or does not decode to its size is ``None`` for that
member; the caller reads those through zarr, whose findings name the damage. A tile never
stored (all fill value: zarr writes none) reads as the fill value, as zarr reads it.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import numpy.typing as npt
from numcodecs import blosc

from octstage.cellpainting.packstore import EMPTY, SHARD_KEY


@dataclass(frozen=True)
class Layout:
    """A pack's array ``[K, C, Y, X]``, its tile ``[C, ty, tx]`` and tiles per shard axis."""

    shape: tuple[int, ...]
    tile: tuple[int, int, int]
    grid: tuple[int, int, int]  # K, tile rows, tile columns
    fill: int  # what zarr reads where a tile was never stored (all fill value: not written)


Place = tuple[int, tuple[int, ...]]  # a member's index in the pack and its [C, Y, X]
INNER = ["bytes", "blosc", "crc32c"]


def fields(
    array_dir: Path, places: Sequence[Place]
) -> Iterator[npt.NDArray[np.uint8] | None] | None:
    """Each member's values ``[C, Y, X]`` in ``places`` order (None: read it through zarr), or
    None when the pack is not one this reads (missing files, another layout, a bad index)."""
    try:
        meta = json.loads(_read_regular(array_dir / "zarr.json"))
        layout = _layout(meta)
        fd = _open_regular(array_dir / SHARD_KEY)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    try:
        index = _index(fd, layout)
    except OSError:
        index = None
    if index is None or any(_misfit(layout.shape, p) for p in places):
        os.close(fd)
        return None
    return _members(fd, layout, index, places)


def _open_regular(path: Path) -> int:
    """A descriptor of ``path`` for reading; OSError when it is no regular file (a FIFO or a
    device: opened without waiting for a writer, then refused, so verify never blocks)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path}: not a regular file")
    return fd


def _read_regular(path: Path) -> bytes:
    fd = _open_regular(path)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def _layout(meta: dict[str, Any]) -> Layout:
    """The shape and tiles of a pack's metadata; ValueError for any other layout."""
    shape = [int(n) for n in meta["shape"]]
    (sharding,) = meta["codecs"]
    config = sharding["configuration"]
    inner = [int(n) for n in config["chunk_shape"]]
    shard = [int(n) for n in meta["chunk_grid"]["configuration"]["chunk_shape"]]
    ours = (
        meta.get("zarr_format") == 3
        and meta.get("data_type") == "uint8"
        and sharding["name"] == "sharding_indexed"
        and [c["name"] for c in config["codecs"]] == INNER
        and config["codecs"][0].get("configuration", {}).get("endian", "little") == "little"
        and [c["name"] for c in config["index_codecs"]] == ["bytes", "crc32c"]
        and config["index_codecs"][0].get("configuration", {}).get("endian") == "little"
        and config.get("index_location", "end") == "end"
        and len(shape) == 4
        and inner[:2] == [1, shape[1]]
        and shard[:2] == shape[:2]  # one shard: the pack's one data object
        and all(
            s >= n and s % i == 0 for s, n, i in zip(shard[2:], shape[2:], inner[2:], strict=True)
        )
    )
    if not ours:
        raise ValueError("not a pack as packstore writes it")
    grid = (shape[0], shard[2] // inner[2], shard[3] // inner[3])
    return Layout(tuple(shape), (inner[1], inner[2], inner[3]), grid, meta["fill_value"])


def _index(fd: int, layout: Layout) -> npt.NDArray[np.uint64] | None:
    """The shard's index ``[K, rows, cols, 2]`` (offset, length), None when its crc32c fails or
    an entry points outside the shard's body."""
    k, rows, cols = layout.grid
    size = k * rows * cols * 16
    total = os.fstat(fd).st_size
    if total < size + 4:
        return None
    raw = os.pread(fd, size + 4, total - size - 4)
    if google_crc32c.value(raw[:size]) != int.from_bytes(raw[size:], "little"):
        return None
    index = np.frombuffer(raw[:size], "<u8").reshape(k, rows, cols, 2)
    written = index[..., 0] != EMPTY
    if np.any(index[written].sum(axis=-1) > total - size - 4):
        return None
    return index


def _misfit(shape: tuple[int, ...], place: Place) -> bool:
    """A member with no place in the pack (``packstore`` words why)."""
    index, size = place
    if len(size) != 3:
        return True
    return (
        not 0 <= index < shape[0] or size[0] != shape[1] or size[1] > shape[2] or size[2] > shape[3]
    )


def _members(
    fd: int, layout: Layout, index: npt.NDArray[np.uint64], places: Sequence[Place]
) -> Iterator[npt.NDArray[np.uint8] | None]:
    try:
        for place in places:
            yield _member(fd, layout, index, place)
    finally:
        os.close(fd)


def _member(
    fd: int, layout: Layout, index: npt.NDArray[np.uint64], place: Place
) -> npt.NDArray[np.uint8] | None:
    """One member's values from its tiles, or None when one is empty, damaged or undecodable."""
    (slot, (c, y, x)), (ty, tx) = place, layout.tile[1:]
    rows, cols = -(-y // ty), -(-x // tx)
    out = np.empty((c, rows * ty, cols * tx), dtype=np.uint8)
    tile_bytes = c * ty * tx
    for r in range(rows):
        for col in range(cols):
            offset, length = (int(n) for n in index[slot, r, col])
            where = (slice(None), slice(r * ty, (r + 1) * ty), slice(col * tx, (col + 1) * tx))
            if offset == EMPTY:  # never stored: zarr reads fill value, and so does this
                out[where] = layout.fill
                continue
            if length < 4:
                return None
            data = os.pread(fd, length, offset)
            body = data[:-4]
            if google_crc32c.value(body) != int.from_bytes(data[-4:], "little"):
                return None
            try:
                raw = blosc.decompress(body)
            except Exception:  # noqa: BLE001 - zarr reads it again and words the failure
                return None
            if len(raw) != tile_bytes:
                return None
            tile = np.frombuffer(raw, np.uint8).reshape(c, ty, tx)
            out[where] = tile
    return out[:, :y, :x]
