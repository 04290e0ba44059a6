"""Guards of the cache reader that no other test pinned: a shard index entry pointing past the
shard is a DataError (never fill values), and the stored shape is compared with the manifest's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import google_crc32c
import numpy as np
import pytest

from octstage.cache.volumestore import write_volume
from octtrain.data.arrayread import open_array
from octtrain.data.volumeread import read_volume
from octtrain.errors import DataError
from tests.octstage.test_manifest import make_volume

SHARD = "c/0/0/0"


def _volume(root: Path) -> np.ndarray:
    shape = (9, 40, 44)
    data: np.ndarray = ((np.indices(shape).sum(axis=0) * 3) % 256).astype(np.uint8)
    write_volume(root, "volumes/1001/abc.ome.zarr", data, (1.0, 1.0, 1.0), {}, chunks=(4, 16, 16))
    return data


def test_an_index_entry_past_the_shard_is_a_data_error_not_fill_values(tmp_path: Path) -> None:
    _volume(tmp_path)
    path = tmp_path / "volumes/1001/abc.ome.zarr/0"
    raw = bytearray((path / SHARD).read_bytes())
    n = 27  # a 3 x 3 x 3 grid of inner chunks, one (offset, length) pair each, then a crc32c
    index = len(raw) - n * 16 - 4
    entries = np.frombuffer(bytes(raw[index : index + n * 16]), dtype="<u8").reshape(n, 2).copy()
    entries[0] = (len(raw) + 1000, entries[0][1])  # the first chunk "stored" past the end
    body = entries.astype("<u8").tobytes()
    raw[index:] = body + google_crc32c.value(body).to_bytes(4, "little")  # the crc agrees
    (path / SHARD).write_bytes(bytes(raw))
    with pytest.raises(DataError, match="an entry past its end"):
        open_array(path, "x").read()


def test_a_stored_shape_other_than_the_manifests_is_a_data_error(tmp_path: Path) -> None:
    data = _volume(tmp_path)
    listed = dataclasses.replace(make_volume("1001"), shape=data.shape)
    assert np.array_equal(read_volume(tmp_path, listed), data)
    wrong = dataclasses.replace(listed, shape=(9, 40, 45))
    with pytest.raises(
        DataError, match=r"shape \(9, 40, 44\) differs from the manifest's \(9, 40, 45\)"
    ):
        read_volume(tmp_path, wrong)
