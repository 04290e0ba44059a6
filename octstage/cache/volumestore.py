"""One cached volume on disk: an OME-Zarr (0.5) group whose array ``0`` is uint8, sharded whole.

Layout under the cache root: ``volumes/<participant_id>/<cache_key>.ome.zarr/`` with the group's
``zarr.json`` (OME multiscales metadata with the DICOM spacing) and array ``0`` (blosc-zstd
then a crc32c of the compressed bytes per chunk, chunks (16,128,128), one shard per volume, so
one data object per volume; caches written before the crc32c have blosc alone and read alike).
A volume is written into a hidden temporary folder and renamed into place, so a half-written
volume is never found under its final name (``write_atomic``); for a bucket its objects are
encoded in memory and uploaded data first (``encode_objects``). Cell Painting fields
(``cellpainting.fieldstore``) are written by the same two functions.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import zarr
from zarr.abc.codec import BytesBytesCodec
from zarr.codecs import BloscCodec, BloscShuffle, Crc32cCodec
from zarr.core.buffer import Buffer, default_buffer_prototype
from zarr.storage import MemoryStore

from octstage.errors import VerificationError

CHUNKS: tuple[int, int, int] = (16, 128, 128)
# The array is (frames, rows, columns) as the DICOM stores it: B-scans along the slow scan
# (OCT's y), depth within a B-scan (the axial direction, z), A-scans across it (x).
AXES: tuple[str, str, str] = ("y", "z", "x")


def volume_relpath(participant_id: str, cache_key: str) -> str:
    """Where a volume lives, relative to the cache root."""
    return f"volumes/{participant_id}/{cache_key}.ome.zarr"


# How zarr's crc32c codec (after blosc in each chunk, after a shard's index) says that bytes
# changed since they were written (it names two byte strings, not the cause): said in words
# instead, by verify and stage alike (any other text is shown as is).
ZARR_CRC_MISMATCH = "Stored and computed checksum do not match"
CHANGED_BYTES = (
    "a chunk or shard index fails its crc32c checksum (its bytes changed after they were written)"
)


def crc_mismatch(exc: BaseException) -> bool:
    """Whether a read failed on zarr's crc32c check (see ``CHANGED_BYTES``)."""
    return isinstance(exc, ValueError) and str(exc).startswith(ZARR_CRC_MISMATCH)


def array_checksum(array: npt.NDArray[Any]) -> str:
    """``sha256:<hex>`` of the array's values in C order (independent of codec and chunking)."""
    return "sha256:" + hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def ome_attributes(name: str, spacing_mm: tuple[float, float, float]) -> dict[str, Any]:
    """OME-Zarr 0.5 multiscales metadata for a single-resolution image with ``AXES``."""
    return {
        "ome": {
            "version": "0.5",
            "multiscales": [
                {
                    "name": name,
                    "axes": [
                        {"name": axis, "type": "space", "unit": "millimeter"} for axis in AXES
                    ],
                    "datasets": [
                        {
                            "path": "0",
                            "coordinateTransformations": [
                                {"type": "scale", "scale": [float(s) for s in spacing_mm]}
                            ],
                        }
                    ],
                }
            ],
        }
    }


def chunk_and_shard(
    shape: tuple[int, ...], chunks: tuple[int, int, int]
) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Chunks clipped to the volume, and one shard covering it in whole chunks.

    Zarr needs the shard to be a multiple of the chunk; the array itself need not fill it.
    """
    clipped = tuple(min(c, s) for c, s in zip(chunks, shape, strict=True))
    shard = tuple(-(-s // c) * c for c, s in zip(clipped, shape, strict=True))
    return (clipped[0], clipped[1], clipped[2]), (shard[0], shard[1], shard[2])


def chunk_codecs(clevel: int, shuffle: BloscShuffle) -> list[BytesBytesCodec]:
    """Each chunk's codecs after ``bytes`` (volumes and Cell Painting fields alike): blosc-zstd,
    then a crc32c of the compressed bytes, so a chunk whose bytes change yet still decode (a
    flipped literal byte) fails its checksum instead of reading as other values."""
    return [BloscCodec(cname="zstd", clevel=clevel, shuffle=shuffle), Crc32cCodec()]


def _create(
    store: Any,
    name: str,
    array: npt.NDArray[np.uint8],
    spacing_mm: tuple[float, float, float],
    attributes: Mapping[str, Any],
    chunks: tuple[int, int, int],
    clevel: int,
) -> None:
    """The OME-Zarr group and its array ``0`` in ``store`` (a path or a zarr store)."""
    chunks, shard = chunk_and_shard(array.shape, chunks)
    group = zarr.create_group(
        store=store, zarr_format=3, attributes=ome_attributes(name, spacing_mm)
    )
    group.create_array(
        name="0",
        shape=array.shape,
        dtype=np.uint8,
        chunks=chunks,
        shards=shard,
        compressors=chunk_codecs(clevel, BloscShuffle.shuffle),
        dimension_names=AXES,
        attributes=dict(attributes),
    )[...] = array


def write_volume(
    cache_root: Path,
    relpath: str,
    array: npt.NDArray[np.uint8],
    spacing_mm: tuple[float, float, float],
    attributes: Mapping[str, Any],
    chunks: tuple[int, int, int] = CHUNKS,
    clevel: int = 3,
) -> str:
    """Write ``array`` atomically at ``cache_root/relpath``; returns its checksum.

    If a complete volume already sits there (same cache key, so same content) it is kept.
    """
    write_atomic(
        cache_root / relpath,
        lambda store, name: _create(store, name, array, spacing_mm, attributes, chunks, clevel),
    )
    return array_checksum(array)


def write_atomic(final: Path, create: Callable[[Any, str], None]) -> None:
    """Have ``create(store, name)`` write an OME-Zarr group into a hidden temporary folder beside
    ``final`` (``store`` its path), fsync it and rename it to ``final``: a half-written group is
    never found under its final name. A complete group already at ``final`` is kept (the name is
    a content hash: same name, same bytes)."""
    tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        create(str(tmp), final.name)
        _fsync_tree(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "zarr.json").exists():
                raise
            # Another worker (or an earlier run) finished the same key first: identical content.
            shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def encode_volume(
    relpath: str,
    array: npt.NDArray[np.uint8],
    spacing_mm: tuple[float, float, float],
    attributes: Mapping[str, Any],
    chunks: tuple[int, int, int] = CHUNKS,
    clevel: int = 3,
) -> list[tuple[str, bytes]]:
    """The volume's objects (name relative to its folder, bytes), in the order to upload them
    (``encode_objects``)."""
    return encode_objects(
        relpath,
        lambda store, name: _create(store, name, array, spacing_mm, attributes, chunks, clevel),
    )


def encode_objects(relpath: str, create: Callable[[Any, str], None]) -> list[tuple[str, bytes]]:
    """The objects ``create(store, name)`` writes for the group at ``relpath`` (names relative
    to its folder, bytes), in the order to upload them: data first, array metadata, then the
    group's ``zarr.json``: an object store has no rename, so a reader that finds the group
    metadata finds everything under it."""
    buffers: dict[str, Buffer] = {}
    create(MemoryStore(buffers), Path(relpath).name)
    objects = {key: buf.to_bytes() for key, buf in buffers.items()}
    order = sorted(objects, key=lambda k: (k == "zarr.json", k.endswith("zarr.json"), k))
    return [(key, objects[key]) for key in order]


def open_objects(objects: Mapping[str, bytes]) -> zarr.Array[Any]:
    """Array ``0`` of a volume whose objects (names relative to its folder) are in memory."""
    make = default_buffer_prototype().buffer.from_bytes
    buffers: dict[str, Buffer] = {key: make(data) for key, data in objects.items()}
    return zarr.open_array(store=MemoryStore(buffers), path="0", mode="r")


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())


def irregular_files(folder: Path) -> list[str]:
    """The entries under ``folder`` that are neither folders nor regular files (a FIFO, a
    device, a socket; a link is followed), relative to it: opening one blocks or reads what
    is no stored object, so every reader of a cache refuses it first."""
    found = []
    for top, dirs, files in os.walk(folder):
        for name in [*files, *(d for d in dirs if os.path.islink(os.path.join(top, d)))]:
            path = Path(top) / name
            try:
                mode = path.stat().st_mode
            except OSError:
                continue  # gone or a dangling link: the read that follows names it
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                found.append(path.relative_to(folder).as_posix())
    return sorted(found)


def refuse_irregular(cache_root: Path, relpath: str) -> None:
    """VerificationError naming every non-regular file of the array folder ``relpath``."""
    bad = irregular_files(cache_root / relpath)
    if bad:
        shown = ", ".join(f"{relpath}/{b}" for b in bad[:3])
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise VerificationError(
            f"{relpath}: {shown}{more}: not a regular file (a FIFO or device), never read: "
            "put the stored file back (octstage stage fetches it again) or rebuild"
        )


def read_volume(cache_root: Path, relpath: str) -> npt.NDArray[np.uint8]:
    """The stored array of a volume, fully read (a non-regular file in it refused first)."""
    refuse_irregular(cache_root, relpath)
    arr = zarr.open_array(store=str(cache_root / relpath / "0"), mode="r")
    return np.asarray(arr[...], dtype=np.uint8)


def read_attributes(cache_root: Path, relpath: str) -> dict[str, Any]:
    """The array attributes (spacing, device, normalization...) of a stored volume."""
    arr = zarr.open_array(store=str(cache_root / relpath / "0"), mode="r")
    return dict(arr.attrs)


def check_volume(cache_root: Path, relpath: str, checksum: str) -> None:
    """Raise VerificationError unless the stored volume exists and matches ``checksum``."""
    if not (cache_root / relpath / "0" / "zarr.json").is_file():
        raise VerificationError(f"{relpath}: missing from the cache")
    actual = array_checksum(read_volume(cache_root, relpath))
    if actual != checksum:
        raise VerificationError(f"{relpath}: checksum {actual} does not match {checksum}")


def absent_objects(cache_root: Path, relpath: str) -> list[str]:
    """Data objects (shards) of a stored volume's array that are not on disk, named relative to
    the volume folder. Zarr reads an absent object as the fill value without a word, so a
    volume whose values changed and that lacks objects has lost data, not had it altered."""
    array = zarr.open_array(store=str(cache_root / relpath / "0"), mode="r")
    meta: Any = array.metadata
    grid = meta.chunk_grid
    keys = (meta.encode_chunk_key(c) for c in grid.all_chunk_coords(array.shape))
    return [f"0/{key}" for key in keys if not (cache_root / relpath / "0" / key).is_file()]
