"""build-cache end to end on the synthetic dataset: traps, correctness and outputs of one build.

Real dask workers, real zarr, real DICOM. One build (the session-scoped ``built`` fixture in
conftest.py, 2 local worker processes) is shared by the read-only checks; re-runs over it are in
test_build_resume.py, other sources and schedulers in test_build_sources.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pydicom
import pydicom.data
import pytest
import zarr

from octstage import manifest as mf
from octstage.cache import volumestore
from octstage.cache.verify import verify
from octstage.cachebuild import normalize
from octstage.cachebuild.normalize import normalize_volume, scaled_spacing
from octstage.cachebuild.plan import (
    InventoryEntry,
    Record,
    cache_key,
    header_verdict,
    parse_inventory,
    precheck,
    software_versions,
)
from octstage.config import BuildConfig
from octstage.dataset import dicom
from octstage.dataset.labels import Participant
from octstage.dataset.synth import SynthInfo
from octstage.errors import OctstageError
from tests.octstage.build_helpers import (
    CONFIG,
    OCT,
    SHAPE,
    Built,
    build,
    rejected,
)

# What the manifest must say for each kind of trap synth plants (SynthInfo.excluded values).
TRAP_REASONS = {
    "folder_not_id": r"^participant ID: folder: not a 4-digit",
    "filename_not_id": r"^participant ID: file-name prefix: not a 4-digit",
    "folder_filename_disagree": r"^participant ID: folder '\d{4}' != file prefix '\d{4}'",
    "patient_id_missing": r"^participant ID: PatientID missing",
    "patient_id_disagrees": r"^participant ID: PatientID '\d{4}' != folder '\d{4}'",
    "patient_id_not_id": r"^participant ID: PatientID: not a 4-digit",
    "unreadable": r"^DICOM: (empty file|not a DICOM file)",
    "truncated": r"^truncated: pixel data truncated",
    "no_pixel_data": r"^no pixel data: ",
    "irregular_grid": r"^irregular grid: .*radial",
}


def test_every_trap_is_rejected_with_its_reason(built: Built, synth_info: SynthInfo) -> None:
    reasons = rejected(built.manifest)
    assert built.code == 1  # something was rejected, the manifest was still written
    for name, kind in synth_info.excluded.items():
        assert name in reasons, f"{name} ({kind}) not rejected"
        assert re.search(TRAP_REASONS[kind], reasons[name]), (kind, reasons[name])
    unlabelled = [f for f in synth_info.files if f.split("/")[-2] in synth_info.unlabelled_with_oct]
    assert unlabelled
    for name in unlabelled:
        assert reasons[name].startswith("no label: participant "), reasons[name]
    expected = set(synth_info.excluded) | set(unlabelled)
    assert set(reasons) == expected | set(built.planted)


def test_pydicom_broken_files_are_rejected_and_do_not_stop_the_build(built: Built) -> None:
    reasons = rejected(built.manifest)
    for name, pattern in built.planted.items():
        assert re.search(pattern, reasons[name]), (name, reasons[name])
    assert len(built.manifest.volumes) > 100


def test_every_good_file_is_in_the_manifest_with_its_labels(
    built: Built, synth_info: SynthInfo
) -> None:
    bad = set(rejected(built.manifest))
    good = [f for f in synth_info.files if f not in bad]
    by_source = {v.source_path: v for v in built.manifest.volumes}
    assert sorted(by_source) == sorted(good)
    for v in built.manifest.volumes:
        assert v.participant_id == v.source_path.split("/")[-2]
        assert v.label == synth_info.labels[v.participant_id]
        assert v.split == synth_info.splits[v.participant_id]
        assert built.manifest.classes[v.label] == v.study_group
        assert v.transfer_syntax == synth_info.transfer_syntaxes[v.source_path]
        assert v.laterality == v.source_path.split("_")[-2].upper()
        assert v.shape == SHAPE and v.dtype == "uint8"
        assert v.source_sha1 == hashlib.sha1((built.src / v.source_path).read_bytes()).hexdigest()
    assert {v.transfer_syntax for v in built.manifest.volumes} == set(
        synth_info.transfer_syntaxes.values()
    )
    counts = built.manifest.header.counts
    assert counts["volumes"] == len(good) and counts["rejected"] == len(bad)
    assert built.summary["built"] == len(good) and built.summary["reused"] == 0


def test_stored_volumes_equal_an_independent_decode_and_normalization(built: Built) -> None:
    # pydicom's own decoder choice (not octstage.dataset.dicom's) then the pure normalization.
    for v in built.manifest.volumes:
        pixels = pydicom.dcmread(built.src / v.source_path).pixel_array.astype(np.uint8)
        want, norm = normalize_volume(pixels, SHAPE, 1.0, 99.0, (2, 4, 4), "area")
        got = volumestore.read_volume(built.cache, v.zarr_path)
        assert (norm.low, norm.high) == (v.normalization.low, v.normalization.high), v.source_path
        np.testing.assert_array_equal(got, want, err_msg=v.source_path)
        assert v.checksum == volumestore.array_checksum(got)
        # What the trainer standardises its input with: the stored array's mean and std.
        assert v.intensity is not None, v.source_path
        assert v.intensity.mean == pytest.approx((got.mean(),), abs=1e-3)
        assert v.intensity.std == pytest.approx((got.std(),), abs=1e-3)


def test_array_attributes_hold_no_other_header_field(built: Built) -> None:
    v = built.manifest.volumes[0]
    attrs = volumestore.read_attributes(built.cache, v.zarr_path)
    assert set(attrs) == {
        "device",
        "laterality",
        "transfer_syntax",
        "source_shape",
        "source_spacing_mm",
        "spacing_mm",
        "normalization",
    }
    assert attrs["source_shape"] == list(v.source_shape)
    stored = scaled_spacing(v.spacing_mm, v.source_shape, v.shape)
    assert attrs["spacing_mm"] == pytest.approx(list(stored))
    group = json.loads((built.cache / v.zarr_path / "zarr.json").read_text())
    scale = group["attributes"]["ome"]["multiscales"][0]["datasets"][0]["coordinateTransformations"]
    assert scale[0]["scale"] == pytest.approx(list(stored))
    arr = zarr.open_array(store=str(built.cache / v.array_path), mode="r")
    assert arr.chunks == SHAPE  # chunks clipped to the (small) volume, one shard


def test_an_ome_zarr_reader_opens_a_built_volume_with_its_dicom_spacing(built: Built) -> None:
    """A built volume as a viewer sees it: B-scans along y, depth along z, A-scans along x, each
    axis scaled by the source's own spacing for it (read here with pydicom, not octstage),
    stretched by the resize."""
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Multiscales, Reader

    for v in built.manifest.volumes[:3]:
        ds = pydicom.dcmread(built.src / v.source_path, stop_before_pixels=True)
        measures = ds.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0]
        row_mm, column_mm = (float(s) for s in measures.PixelSpacing)
        frame_mm = float(measures.SliceThickness)  # what the synthetic writer records
        source = (int(ds.NumberOfFrames), int(ds.Rows), int(ds.Columns))
        spacing = (frame_mm, row_mm, column_mm)
        want = [mm * n / out for mm, n, out in zip(spacing, source, SHAPE, strict=True)]
        location = parse_url(str(built.cache / v.zarr_path))
        assert location is not None
        (node,) = [n for n in Reader(location)() if n.load(Multiscales)]
        assert [a["name"] for a in node.metadata["axes"]] == ["y", "z", "x"], v.source_path
        (transforms,) = node.metadata["coordinateTransformations"]
        assert transforms[0]["scale"] == pytest.approx(want, rel=1e-6), v.source_path
        (data,) = node.data
        assert data.shape == SHAPE
        arr = zarr.open_array(store=str(built.cache / v.array_path), mode="r")
        assert arr.metadata.dimension_names == ("y", "z", "x")  # OME 0.5: same as the axes


def test_outputs_beside_the_manifest(built: Built) -> None:
    config = json.loads((built.cache / "build-config.json").read_text())
    assert config["config"] == json.loads(json.dumps(CONFIG.as_dict()))
    assert config["config_hash"] == CONFIG.params_hash()
    assert config["code_version"] == built.manifest.header.code_version
    assert (built.cache / "qc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert built.manifest.header.config_hash == CONFIG.params_hash()
    report = verify(built.manifest_path)
    assert report.ok and report.verified == len(built.manifest.volumes), report
    assert report.schema == "valid"


def test_build_refuses_a_source_without_oct_files(tmp_path: Path, built: Built) -> None:
    (tmp_path / "empty").mkdir()
    shutil.copy(built.src / "participants.tsv", tmp_path / "empty")
    with pytest.raises(OctstageError, match="no files under"):
        build(tmp_path / "empty", tmp_path / "cache")


# ---- the pure planning functions ---------------------------------------------------------


def test_cache_key_depends_on_source_and_every_parameter() -> None:
    base = cache_key("a" * 40, CONFIG)
    assert base == cache_key("a" * 40, BuildConfig(shape=SHAPE))
    assert base != cache_key("b" * 40, CONFIG)
    for change in ({"shape": (8, 32, 33)}, {"p_low": 2.0}, {"subsample": (1, 1, 1)}):
        assert base != cache_key("a" * 40, BuildConfig(**{"shape": SHAPE, **change}))


def test_cache_key_changes_with_decoder_and_preprocessing_versions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = cache_key("a" * 40, CONFIG)
    versions = software_versions()
    for name in ("pydicom", "pylibjpeg", "pylibjpeg-openjpeg", "pylibjpeg-rle", "pillow"):
        assert versions[name] != "absent"  # the decoders this project installs are reported
    assert {"octstage-preprocess", "opencv"} <= set(versions)
    assert base == cache_key("a" * 40, CONFIG, versions)
    decoders = dicom.decoder_versions()
    for name in ("pydicom", "pylibjpeg-openjpeg", "pyjpegls"):  # one installed, one absent
        changed = {**decoders, name: "99.0"}
        monkeypatch.setattr(dicom, "decoder_versions", lambda changed=changed: changed)
        assert cache_key("a" * 40, CONFIG) != base, name
        monkeypatch.undo()
    assert cache_key("a" * 40, CONFIG) == base
    monkeypatch.setattr(normalize, "PREPROCESS_VERSION", normalize.PREPROCESS_VERSION + 1)
    assert cache_key("a" * 40, CONFIG) != base


def test_precheck_decides_path_label_and_inventory_without_reading() -> None:
    people = {"1001": Participant("1001", "healthy", 0, "train", "UW", True)}
    good = f"{OCT}/heidelberg_spectralis/1001/1001_spectralis_mac_r_1.2.3.dcm"
    cand = precheck(good, 10, people, None)
    assert not isinstance(cand, str) and cand.participant_id == "1001"
    assert precheck("participants.tsv", 1, people, None) == (
        "layout: not a .dcm under structural_oct/<device>/<folder>/"
    )
    odd_device = f"{OCT}/octopus/1001/1001_octopus_mac_r_1.2.3.dcm"
    assert str(precheck(odd_device, 1, people, None)).startswith("layout: unknown device")
    misfiled = f"{OCT}/heidelberg_spectralis/1001/1002_spectralis_mac_r_1.2.3.dcm"
    assert str(precheck(misfiled, 1, people, None)).startswith("participant ID: folder '1001'")
    nolabel = good.replace("1001", "4002")
    assert str(precheck(nolabel, 1, people, None)).startswith("no label: participant 4002")
    inv = {good: InventoryEntry(size=11, sha1="ab" * 20)}
    assert str(precheck(good, 10, people, inv)).startswith("inventory: size 10")
    inv = {good: InventoryEntry(size=10, sha1="ab" * 20)}
    cand = precheck(good, 10, people, inv)
    assert not isinstance(cand, str) and cand.expected_sha1 == "ab" * 20


def test_parse_inventory_refuses_other_documents() -> None:
    with pytest.raises(OctstageError, match="not an octstage-inventory/1"):
        parse_inventory({"format": "other"}, "x.json")
    with pytest.raises(OctstageError, match="malformed"):
        parse_inventory({"format": "octstage-inventory/1", "objects": [{"name": "a"}]}, "x")
    got = parse_inventory(
        {"format": "octstage-inventory/1", "objects": [{"name": "a", "size": 3, "sha1": "AB"}]}, "x"
    )
    assert got == {"a": InventoryEntry(3, "ab")}


def test_header_verdict_checks_patient_id_and_eye() -> None:
    name = f"{OCT}/topcon_triton/4150/4150_triton_3d_l_1.2.3.dcm"
    assert header_verdict(name, "4150 ", "L") == ("4150", "L")
    assert header_verdict(name, "4150", None) == ("4150", "L")
    assert str(header_verdict(name, "4151", "L")).startswith("participant ID: PatientID")
    assert str(header_verdict(name, "4150", "R")).startswith("laterality: header says R")


def test_record_round_trips_and_refuses_partial_documents() -> None:
    record = Record(
        "k",
        "a" * 40,
        12,
        "1001",
        "R",
        "1.2.840.10008.1.2.1",
        (8, 62, 96),
        (0.1, 0.01, 0.02),
        "volumes/1001/k.ome.zarr",
        SHAPE,
        "uint8",
        mf.Normalization(1.0, 99.0, 3.0, 250.0),
        "sha256:" + "0" * 64,
    )
    assert Record.from_dict(json.loads(json.dumps(record.to_dict()))) == record
    measured = dataclasses.replace(record, intensity=mf.Intensity((41.5,), (12.25,)))
    assert Record.from_dict(json.loads(json.dumps(measured.to_dict()))) == measured
    partial = record.to_dict()
    del partial["checksum"]
    with pytest.raises(ValueError, match="incomplete"):
        Record.from_dict(partial)
