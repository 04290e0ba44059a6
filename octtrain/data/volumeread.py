"""Reading one cached volume completely, or not at all: never a fill value in place of data.

Zarr answers a read of a chunk whose object is missing with the array's fill value, so a cache
whose shard files were deleted reads as zeros without an error. ``read_volume`` therefore first
checks that every data object the array's metadata implies exists and is at least as long as its
shard index (a cheap ``stat`` per object; one per volume in an octstage cache), then decodes; a
failed decode (checksum of the shard index, blosc) becomes a ``DataError`` too. Every error
names the volume and its path, and points at ``octstage verify``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import zarr
from zarr.codecs import ShardingCodec
from zarr.core.chunk_grids import RegularChunkGrid

from octstage.manifest import Volume
from octtrain.errors import DataError

INDEX_ENTRY_BYTES = 16  # a shard index holds (offset, length) as two uint64 per inner chunk
CRC_BYTES = 4  # the index's crc32c


def data_keys(array: zarr.Array[Any]) -> list[tuple[str, int]]:
    """``(key, minimum bytes)`` of every data object of ``array`` (shards, or plain chunks)."""
    meta = array.metadata
    grid_of = meta.chunk_grid
    if not isinstance(grid_of, RegularChunkGrid):
        raise DataError(f"{array.path}: chunk grid {grid_of!r} is not regular")
    outer = grid_of.chunk_shape
    grid = [math.ceil(s / c) for s, c in zip(array.shape, outer, strict=True)]
    minimum = 1
    codecs = getattr(meta, "codecs", ())  # zarr v3 metadata; a v2 array has none
    codec = codecs[0] if codecs else None
    if isinstance(codec, ShardingCodec):
        inner = math.prod(math.ceil(o / i) for o, i in zip(outer, codec.chunk_shape, strict=True))
        minimum = inner * INDEX_ENTRY_BYTES + CRC_BYTES
    keys = []
    for coords in np.ndindex(*grid):
        keys.append((meta.encode_chunk_key(tuple(int(c) for c in coords)), minimum))
    return keys


def read_volume(cache_root: Path, volume: Volume) -> npt.NDArray[np.uint8]:
    """The whole stored array of ``volume``; DataError when any part of it is not in the cache
    or does not decode."""
    path = cache_root / volume.array_path
    where = f"volume {volume.cache_key} (participant {volume.participant_id}) at {path}"
    advice = "run `octstage verify` on the manifest, then rebuild or restage the cache"
    try:
        array = zarr.open_array(store=str(path), mode="r", zarr_format=3)
    except FileNotFoundError:
        raise DataError(f"{where}: not in the cache (no zarr.json); {advice}") from None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise DataError(f"{where}: array metadata unreadable ({exc}); {advice}") from None
    for key, minimum in data_keys(array):
        try:
            size = (path / key).stat().st_size
        except OSError:
            raise DataError(f"{where}: data object {key} is missing; {advice}") from None
        if size < minimum:
            raise DataError(
                f"{where}: data object {key} is {size} bytes, shorter than its "
                f"{minimum}-byte index; {advice}"
            )
    try:
        data = np.asarray(array[...])
    except (OSError, ValueError, RuntimeError) as exc:
        raise DataError(f"{where}: data does not decode ({exc}); {advice}") from None
    if data.shape != tuple(volume.shape):
        raise DataError(f"{where}: shape {data.shape} differs from the manifest's {volume.shape}")
    return data.astype(np.uint8, copy=False)
