"""The QC sheet: one row per device, middle B-scans of the cached volumes."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from matplotlib.image import imread

from octstage import manifest as mf
from octstage.cache import volumestore
from octstage.cache.store import CacheStore
from octstage.cachebuild.plan import qc_sample
from octstage.cachebuild.qc import middle_bscan, qc_sheet


def volume(pid: str, device: str, key: str) -> mf.Volume:
    return mf.Volume(
        participant_id=pid,
        device=device,
        laterality="R",
        protocol="p",
        split="train",
        study_group="healthy",
        label=0,
        source_path=f"retinal_oct/structural_oct/{device}/{pid}/{pid}_p_r_1.2.dcm",
        source_sha1="0" * 40,
        source_size=1,
        transfer_syntax="1.2.840.10008.1.2.1",
        source_shape=(5, 20, 30),
        spacing_mm=(0.1, 0.01, 0.01),
        zarr_path=volumestore.volume_relpath(pid, key),
        shape=(5, 20, 30),
        dtype="uint8",
        normalization=mf.Normalization(1.0, 99.0, 0.0, 255.0),
        checksum="sha256:" + "0" * 64,
        cache_key=key,
    )


def test_middle_bscan_is_the_middle_frame(tmp_path: Path) -> None:
    v = volume("1001", "topcon_triton", "k")
    array = np.arange(5 * 20 * 30, dtype=np.uint32).reshape(5, 20, 30).astype(np.uint8)
    volumestore.write_volume(tmp_path, v.zarr_path, array, (1.0, 1.0, 1.0), {})
    np.testing.assert_array_equal(middle_bscan(CacheStore(str(tmp_path)).open_array, v), array[2])


def test_sheet_draws_each_device_row(tmp_path: Path) -> None:
    volumes = []
    for i, device in enumerate(["zeiss_cirrus", "topcon_triton", "zeiss_cirrus"]):
        v = volume(f"100{i}", device, f"k{i}")
        bright = np.full((5, 20, 30), 40 * (i + 1), np.uint8)
        volumestore.write_volume(tmp_path, v.zarr_path, bright, (1.0, 1.0, 1.0), {})
        volumes.append(v)
    png = qc_sheet(CacheStore(str(tmp_path)).open_array, volumes, per_device=2)
    image = imread(io.BytesIO(png))
    assert image.shape[0] > 100 and image.shape[1] > 100
    assert image[..., :3].std() > 0.05  # panels drawn, not a blank page


def test_sheet_for_an_empty_manifest_still_writes(tmp_path: Path) -> None:
    assert qc_sheet(CacheStore(str(tmp_path)).open_array, [])[:4] == b"\x89PNG"


def test_qc_sample_spreads_over_each_device() -> None:
    vols = [volume(f"10{i:02d}", "topcon_triton", f"k{i}") for i in range(10)]
    vols += [volume("4001", "zeiss_cirrus", "z")]
    picked = qc_sample(vols, per_device=3)
    triton = [v.participant_id for v in picked if v.device == "topcon_triton"]
    assert triton == ["1000", "1003", "1006"]
    assert [v.device for v in picked].count("zeiss_cirrus") == 1
