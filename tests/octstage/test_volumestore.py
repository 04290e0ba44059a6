"""Cached volumes: OME-Zarr layout, checksums, atomic placement."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr

from octstage.cache import volumestore
from octstage.errors import VerificationError


@pytest.fixture
def volume() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, size=(16, 64, 96), dtype=np.uint8)


def test_write_read_round_trip_with_ome_metadata(tmp_path: Path, volume: np.ndarray) -> None:
    rel = volumestore.volume_relpath("1001", "k1")
    checksum = volumestore.write_volume(tmp_path, rel, volume, (0.1, 0.02, 0.03), {"device": "d"})
    assert checksum == volumestore.array_checksum(volume)
    np.testing.assert_array_equal(volumestore.read_volume(tmp_path, rel), volume)
    assert volumestore.read_attributes(tmp_path, rel) == {"device": "d"}
    group = json.loads((tmp_path / rel / "zarr.json").read_text())
    multiscale = group["attributes"]["ome"]["multiscales"][0]
    assert group["attributes"]["ome"]["version"] == "0.5"
    assert [a["name"] for a in multiscale["axes"]] == ["y", "z", "x"]
    assert multiscale["datasets"][0]["coordinateTransformations"][0]["scale"] == [0.1, 0.02, 0.03]
    arr = zarr.open_array(store=str(tmp_path / rel / "0"), mode="r")
    assert arr.shards == volume.shape  # one shard: one data object per volume
    data_objects = [
        p for p in (tmp_path / rel / "0").rglob("*") if p.is_file() and p.name != "zarr.json"
    ]
    assert len(data_objects) == 1
    volumestore.check_volume(tmp_path, rel, checksum)


def test_an_ome_zarr_reader_sees_b_scans_along_y_and_depth_along_z(
    tmp_path: Path, volume: np.ndarray
) -> None:
    """Opened by ome-zarr-py, as a viewer would: frames are B-scans (the slow scan, y), rows are
    depth (the axial direction, z), columns are A-scans (x), each with its own spacing."""
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Multiscales, Reader

    rel = volumestore.volume_relpath("1001", "k1")
    volumestore.write_volume(tmp_path, rel, volume, (0.12, 0.0039, 0.011), {})
    location = parse_url(str(tmp_path / rel))
    assert location is not None
    (node,) = [n for n in Reader(location)() if n.load(Multiscales)]
    assert [a["name"] for a in node.metadata["axes"]] == ["y", "z", "x"]
    (transforms,) = node.metadata["coordinateTransformations"]
    assert transforms[0]["scale"] == [0.12, 0.0039, 0.011]
    (data,) = node.data
    np.testing.assert_array_equal(np.asarray(data), volume)


def test_checksum_sees_one_changed_voxel(volume: np.ndarray) -> None:
    changed = volume.copy()
    changed[3, 4, 5] ^= 1
    assert volumestore.array_checksum(changed) != volumestore.array_checksum(volume)


def test_check_volume_reports_missing_and_changed(tmp_path: Path, volume: np.ndarray) -> None:
    rel = volumestore.volume_relpath("1001", "k1")
    with pytest.raises(VerificationError, match="missing"):
        volumestore.check_volume(tmp_path, rel, "sha256:00")
    volumestore.write_volume(tmp_path, rel, volume, (1.0, 1.0, 1.0), {})
    with pytest.raises(VerificationError, match="does not match"):
        volumestore.check_volume(tmp_path, rel, volumestore.array_checksum(volume[::-1]))


def test_rewriting_the_same_key_keeps_one_complete_volume(
    tmp_path: Path, volume: np.ndarray
) -> None:
    rel = volumestore.volume_relpath("1001", "k1")
    first = volumestore.write_volume(tmp_path, rel, volume, (1.0, 1.0, 1.0), {})
    second = volumestore.write_volume(tmp_path, rel, volume, (1.0, 1.0, 1.0), {})
    assert first == second
    assert [p.name for p in (tmp_path / "volumes" / "1001").iterdir()] == ["k1.ome.zarr"]


def test_a_failed_write_leaves_nothing_under_the_final_name(tmp_path: Path) -> None:
    rel = volumestore.volume_relpath("1001", "k2")
    # Text cannot become uint8: zarr fails after the group and array metadata were written.
    not_numbers = np.full((16, 64, 64), "x", dtype=object)
    with pytest.raises(ValueError):
        volumestore.write_volume(tmp_path, rel, not_numbers, (1.0, 1.0, 1.0), {})
    assert not (tmp_path / rel).exists()
    assert list((tmp_path / "volumes" / "1001").iterdir()) == []


def test_shard_covers_whole_chunks_when_the_shape_is_not_a_multiple() -> None:
    assert volumestore.chunk_and_shard((20, 384, 100), (16, 128, 128)) == (
        (16, 128, 100),
        (32, 384, 100),
    )
