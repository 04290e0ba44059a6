"""Reading one cached volume completely, or not at all: never a fill value in place of data.

Zarr answers a read of a chunk whose object is missing with the array's fill value, so a cache
whose shard files were deleted would read as zeros without an error. ``read_volume`` reads
through ``data/arrayread.py``, which opens every data object the region needs (for a whole
volume: every object the metadata implies) and refuses a missing one, a shard shorter than its
index, an index whose checksum fails and a chunk that does not decode, each as a ``DataError``.
Every error names the volume and its path, and points at ``octstage verify``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from octstage.manifest import Volume
from octtrain.data.arrayread import open_array
from octtrain.errors import DataError


def read_volume(cache_root: Path, volume: Volume) -> npt.NDArray[np.uint8]:
    """The whole stored array of ``volume``; DataError when any part of it is not in the cache
    or does not decode."""
    path = cache_root / volume.array_path
    where = f"volume {volume.cache_key} (participant {volume.participant_id}) at {path}"
    array = open_array(path, where)
    if array.shape != tuple(volume.shape):
        raise DataError(
            f"{where}: shape {array.shape} differs from the manifest's {tuple(volume.shape)}"
        )
    return array.read()
