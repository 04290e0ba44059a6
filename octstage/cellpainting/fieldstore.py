"""One cached Cell Painting field: an OME-Zarr (0.5) group whose array ``0`` is uint8
``[C, Y, X]``, chunked ``[C, 64, 64]`` for random crops and sharded whole (one data object per
field, so a staged copy is a handful of objects; a crop reads only the chunks it covers through
the shard index).

Layout under the cache root (a folder or a bucket prefix):
``fields/<plate>/<cache_key>.ome.zarr/``. In a folder a field is written into a hidden temporary
folder and renamed into place, so a half-written field is never found under its final name; for
a bucket its objects are encoded in memory and uploaded data first, group metadata last
(``encode_field``): the two functions ``cache.volumestore`` writes volumes with.
``volumestore.read_volume`` and ``check_volume`` read either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import zarr
from zarr.codecs import BloscShuffle

from octstage.cache.volumestore import array_checksum, chunk_codecs, encode_objects, write_atomic

CROP_CHUNK = 64  # rows and columns per chunk; every channel in one chunk


def field_relpath(plate: str, cache_key: str) -> str:
    """Where a field lives, relative to the cache root."""
    return f"fields/{plate}/{cache_key}.ome.zarr"


def ome_attributes(name: str, channels: Sequence[str]) -> dict[str, Any]:
    """OME-Zarr 0.5 multiscales metadata for a single-resolution ``[c, y, x]`` image."""
    return {
        "ome": {
            "version": "0.5",
            "multiscales": [
                {
                    "name": name,
                    "axes": [
                        {"name": "c", "type": "channel"},
                        {"name": "y", "type": "space"},
                        {"name": "x", "type": "space"},
                    ],
                    "datasets": [
                        {
                            "path": "0",
                            "coordinateTransformations": [
                                {"type": "scale", "scale": [1.0, 1.0, 1.0]}
                            ],
                        }
                    ],
                }
            ],
            "omero": {"channels": [{"label": c} for c in channels]},
        }
    }


def _create(
    store: Any,
    name: str,
    array: npt.NDArray[np.uint8],
    channels: Sequence[str],
    attributes: Mapping[str, Any],
    chunk: int,
    clevel: int,
) -> None:
    """The OME-Zarr group and its array ``0`` in ``store`` (a path or a zarr store)."""
    c, y, x = array.shape
    chunks = (c, min(chunk, y), min(chunk, x))
    shard = (c, -(-y // chunks[1]) * chunks[1], -(-x // chunks[2]) * chunks[2])
    group = zarr.create_group(store=store, zarr_format=3, attributes=ome_attributes(name, channels))
    group.create_array(
        name="0",
        shape=array.shape,
        dtype=np.uint8,
        chunks=chunks,
        shards=shard,
        compressors=chunk_codecs(clevel, BloscShuffle.bitshuffle),
        dimension_names=("c", "y", "x"),
        attributes=dict(attributes),
    )[...] = array


def write_field(
    cache_root: Path,
    relpath: str,
    array: npt.NDArray[np.uint8],
    channels: Sequence[str],
    attributes: Mapping[str, Any],
    chunk: int = CROP_CHUNK,
    clevel: int = 3,
) -> str:
    """Write ``array`` (uint8 [C, Y, X]) atomically at ``cache_root/relpath``; its checksum.
    A complete field already there (same cache key, so same content) is kept."""
    final = cache_root / relpath
    if not (final / "0" / "zarr.json").is_file():
        write_atomic(
            final,
            lambda store, name: _create(store, name, array, channels, attributes, chunk, clevel),
        )
    return array_checksum(array)


def encode_field(
    relpath: str,
    array: npt.NDArray[np.uint8],
    channels: Sequence[str],
    attributes: Mapping[str, Any],
    chunk: int = CROP_CHUNK,
    clevel: int = 3,
) -> list[tuple[str, bytes]]:
    """The field's objects for a bucket (names relative to its folder, bytes), data first and
    the group's ``zarr.json`` last, as ``volumestore.encode_objects`` orders them."""
    return encode_objects(
        relpath,
        lambda store, name: _create(store, name, array, channels, attributes, chunk, clevel),
    )
