"""build-cache end to end on the synthetic dataset: real dask workers, real zarr, real DICOM.

One module-scoped build (2 local worker processes) is shared by the read-only checks; every test
that changes a source, the labels or the parameters works on copies of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import pydicom.data
import pytest
import zarr
from dask.distributed import LocalCluster

from octstage import builddask, volumestore
from octstage import manifest as mf
from octstage.build import INDEX_NAME, run_build
from octstage.buildplan import (
    InventoryEntry,
    Record,
    cache_key,
    header_verdict,
    parse_inventory,
    precheck,
)
from octstage.cli import main
from octstage.config import BuildConfig
from octstage.errors import OctstageError
from octstage.labels import Participant
from octstage.normalize import normalize_volume, scaled_spacing
from octstage.synth import SynthInfo, write_oct_dicom
from octstage.verify import verify

SHAPE = (8, 32, 32)
CONFIG = BuildConfig(shape=SHAPE)
OCT = "retinal_oct/structural_oct"

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
# pydicom's own damaged or foreign test files, dropped into a labelled participant's folder.
PYDICOM_FILES = {
    "rtplan_truncated.dcm": r"^DICOM: ",
    "MR_truncated.dcm": r"^not oct: ",
    "no_meta.dcm": r"^DICOM: not a DICOM file",
    "badVR.dcm": r"^DICOM: unusable image header",
    "meta_missing_tsyntax.dcm": r"^DICOM: no Transfer Syntax UID",
    "CT_small.dcm": r"^not oct: ",
}


@dataclass(frozen=True)
class Built:
    src: Path
    cache: Path
    manifest_path: Path
    manifest: mf.Manifest
    summary: dict[str, Any]
    code: int
    planted: dict[str, str]  # pydicom file (relative name) -> expected reason pattern


def build(
    src: Path, cache: Path, config: BuildConfig = CONFIG, **kwargs: Any
) -> tuple[int, dict[str, Any]]:
    """One in-process build-cache run; returns the exit code and the --json summary."""
    summary_path = cache.parent / f"{cache.name}-summary.json"
    code = run_build(
        source=str(src),
        labels=str(src / "participants.tsv"),
        out=cache,
        manifest=cache / "manifest.json",
        config=config,
        workers=kwargs.pop("workers", 2),
        json_out=summary_path,
        **kwargs,
    )
    return code, json.loads(summary_path.read_text())


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A real dask cluster on loopback (2 worker processes) that the re-run tests share; the
    module's first build starts its own LocalCluster instead, so both paths are exercised."""
    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",  # loopback, any free port: 8787 may be taken
    ) as cluster:
        yield cluster


@pytest.fixture
def scheduler(cluster: Any) -> str:
    return str(cluster.scheduler_address)


def copy_cache(built: Built, dest: Path) -> Path:
    shutil.copytree(built.cache, dest)
    return dest


@pytest.fixture(scope="module")
def built(synth_info: SynthInfo, tmp_path_factory: pytest.TempPathFactory) -> Built:
    base = tmp_path_factory.mktemp("build")
    src = base / "src"
    shutil.copytree(synth_info.root, src)
    pid = synth_info.verified[-1]
    folder = next((src / OCT).glob(f"*/{pid}"))
    test_files = Path(pydicom.data.get_testdata_file("CT_small.dcm")).parent  # type: ignore[arg-type]
    planted = {}
    for n, (fname, pattern) in enumerate(PYDICOM_FILES.items()):
        stem = fname.removesuffix(".dcm").lower().replace("_", "")
        target = folder / f"{pid}_pydicom_{stem}_r_1.2.826.0.1.3680043.8.498.99.{n}.dcm"
        shutil.copyfile(test_files / fname, target)
        planted[target.relative_to(src).as_posix()] = pattern
    cache = base / "cache"
    code, summary = build(src, cache)
    manifest = mf.load(cache / "manifest.json")
    return Built(src, cache, cache / "manifest.json", manifest, summary, code, planted)


def rejected(m: mf.Manifest) -> dict[str, str]:
    return {r.source: r.reason for r in m.rejected}


def test_every_trap_is_rejected_with_its_reason(built: Built, synth_info: SynthInfo) -> None:
    reasons = rejected(built.manifest)
    assert built.code == 1  # something was rejected, the manifest was still written
    for name, kind in synth_info.excluded.items():
        assert name in reasons, f"{name} ({kind}) not rejected"
        assert re.search(TRAP_REASONS[kind], reasons[name]), (kind, reasons[name])
    for name in synth_info.undecodable:
        assert reasons[name].startswith("DICOM: "), reasons[name]
    unlabelled = [f for f in synth_info.files if f.split("/")[-2] in synth_info.unlabelled_with_oct]
    assert unlabelled
    for name in unlabelled:
        assert reasons[name].startswith("no label: participant "), reasons[name]
    expected = set(synth_info.excluded) | set(synth_info.undecodable) | set(unlabelled)
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
    # pydicom's own decoder choice (not octstage.dicom's) then the pure normalization.
    for v in built.manifest.volumes:
        pixels = pydicom.dcmread(built.src / v.source_path).pixel_array.astype(np.uint8)
        want, norm = normalize_volume(pixels, SHAPE, 1.0, 99.0, (2, 4, 4), "area")
        got = volumestore.read_volume(built.cache, v.zarr_path)
        assert (norm.low, norm.high) == (v.normalization.low, v.normalization.high), v.source_path
        np.testing.assert_array_equal(got, want, err_msg=v.source_path)
        assert v.checksum == volumestore.array_checksum(got)


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


def test_rerun_reuses_everything_without_reading_or_decoding(
    built: Built, tmp_path: Path, scheduler: str
) -> None:
    cache = copy_cache(built, tmp_path / "cache")
    stamps = {p: p.stat().st_mtime_ns for p in (cache / "volumes").rglob("zarr.json")}
    code, summary = build(built.src, cache, scheduler=scheduler)
    assert code == 1
    assert (summary["decoded"], summary["read"], summary["built"]) == (0, 0, 0)
    assert summary["reused"] == len(built.manifest.volumes)
    assert {p: p.stat().st_mtime_ns for p in (cache / "volumes").rglob("zarr.json")} == stamps
    again = mf.load(cache / "manifest.json")
    assert again.volumes == built.manifest.volumes and again.rejected == built.manifest.rejected

    # Without the SHA1 index every source is hashed again, but still nothing is decoded.
    (cache / INDEX_NAME).unlink()
    code, summary = build(built.src, cache, scheduler=scheduler)
    assert summary["decoded"] == 0 and summary["read"] > len(built.manifest.volumes)
    assert mf.load(cache / "manifest.json").volumes == built.manifest.volumes


def test_shape_change_rebuilds_volumes_but_not_rejections(
    built: Built, tmp_path: Path, scheduler: str
) -> None:
    cache = copy_cache(built, tmp_path / "cache")
    n = len(built.manifest.volumes)
    _, summary = build(built.src, cache, BuildConfig(shape=(4, 16, 16)), scheduler=scheduler)
    # Every volume again (the key changed); stored rejections, even the one found by decoding,
    # stay decided: one read and one decode per volume and not one more.
    assert (summary["built"], summary["decoded"], summary["read"]) == (n, n, n)
    m = mf.load(cache / "manifest.json")
    assert {v.shape for v in m.volumes} == {(4, 16, 16)}
    assert {v.cache_key for v in m.volumes}.isdisjoint(v.cache_key for v in built.manifest.volumes)
    assert rejected(m) == rejected(built.manifest)
    # Back to the first shape: its volumes are still there, nothing is decoded.
    _, summary = build(built.src, cache, scheduler=scheduler)
    assert summary["decoded"] == 0 and summary["reused"] == n
    report = verify(cache / "manifest.json")
    assert not report.ok and len(report.extra) == n  # the other shape's volumes, reported


def test_label_change_rebuilds_nothing(built: Built, tmp_path: Path, scheduler: str) -> None:
    src = tmp_path / "src"
    shutil.copytree(built.src, src)
    cache = copy_cache(built, tmp_path / "cache")
    moved = built.manifest.volumes[0].participant_id
    table = (src / "participants.tsv").read_text().splitlines()
    rows = [r.split("\t") for r in table]
    col = rows[0].index("recommended_split")
    for row in rows[1:]:
        if row[0] == moved:
            row[col] = "test" if row[col] != "test" else "val"
            new_split = row[col]
    (src / "participants.tsv").write_text("\n".join("\t".join(r) for r in rows) + "\n")
    _, summary = build(src, cache, scheduler=scheduler)
    assert summary["decoded"] == 0 and summary["read"] == 0
    m = mf.load(cache / "manifest.json")
    assert {v.split for v in m.volumes if v.participant_id == moved} == {new_split}


def test_changed_source_is_hashed_again_and_rebuilt_alone(
    built: Built, tmp_path: Path, scheduler: str
) -> None:
    src = tmp_path / "src"
    shutil.copytree(built.src, src)
    cache = copy_cache(built, tmp_path / "cache")
    touched, rewritten = built.manifest.volumes[0], built.manifest.volumes[1]
    path = src / touched.source_path
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    ds = pydicom.dcmread(src / rewritten.source_path)
    write_oct_dicom(
        src / rewritten.source_path,
        255 - ds.pixel_array.astype(np.uint8),
        patient_id=rewritten.participant_id,
        laterality=rewritten.laterality,
        transfer_syntax=pydicom.uid.ExplicitVRLittleEndian,
        spacing_mm=rewritten.spacing_mm,
        device=rewritten.device,
        sop_instance_uid=str(ds.SOPInstanceUID),
    )
    _, summary = build(src, cache, scheduler=scheduler)
    assert (summary["read"], summary["decoded"], summary["built"]) == (2, 1, 1)
    m = {v.source_path: v for v in mf.load(cache / "manifest.json").volumes}
    assert m[touched.source_path] == touched
    assert m[rewritten.source_path].source_sha1 != rewritten.source_sha1
    assert m[rewritten.source_path].checksum != rewritten.checksum


def write_inventory(src: Path, path: Path, edit: dict[str, dict[str, Any] | None]) -> None:
    """An octstage-inventory/1 of every file under src; ``edit`` overrides or drops entries."""
    objects = []
    for f in sorted((src / OCT).rglob("*.dcm")):
        name = f.relative_to(src).as_posix()
        entry: dict[str, Any] = {
            "name": name,
            "size": f.stat().st_size,
            "sha1": hashlib.sha1(f.read_bytes()).hexdigest(),
        }
        if name in edit:
            change = edit[name]
            if change is None:
                continue
            entry.update(change)
        objects.append(entry)
    doc = {"format": "octstage-inventory/1", "source": str(src), "created": "", "objects": objects}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def test_sha1_mismatch_against_the_inventory_is_rejected(
    built: Built, tmp_path: Path, scheduler: str
) -> None:
    src = tmp_path / "src"
    shutil.copytree(built.src, src)
    cache = copy_cache(built, tmp_path / "cache")
    vols = built.manifest.volumes
    bad, no_sha1, wrong_size, absent = (v.source_path for v in vols[:4])
    edit: dict[str, dict[str, Any] | None] = {
        bad: {"sha1": "0" * 40},
        no_sha1: {"sha1": None},
        wrong_size: {"size": 1},
        absent: None,
    }
    write_inventory(src, src / "_octstage" / "inventory.json", edit)  # the default place
    _, summary = build(src, cache, scheduler=scheduler)
    reasons = rejected(mf.load(cache / "manifest.json"))
    assert reasons[bad].startswith("SHA1 mismatch: ") and "0" * 40 in reasons[bad]
    assert reasons[wrong_size].startswith("inventory: size ")
    assert no_sha1 not in reasons and absent not in reasons
    assert summary["unverified"] == 2 and summary["decoded"] == 0
    assert summary["volumes"] == len(vols) - 2

    # The same verdict when the file has to be read and hashed (no index), via --inventory.
    (cache / INDEX_NAME).unlink()
    elsewhere = tmp_path / "inventory.json"
    shutil.move(src / "_octstage" / "inventory.json", elsewhere)
    _, summary = build(src, cache, inventory=str(elsewhere), scheduler=scheduler)
    assert summary["read"] > 0 and summary["decoded"] == 0
    assert rejected(mf.load(cache / "manifest.json"))[bad] == reasons[bad]


def test_fresh_build_on_an_existing_scheduler_matches(
    built: Built, cluster: Any, tmp_path: Path
) -> None:
    done = cluster.scheduler.task_prefixes
    before = done["run_task"].state_counts["memory"] if "run_task" in done else 0
    code, summary = build(built.src, tmp_path / "cache", scheduler=cluster.scheduler_address)
    assert code == 1 and summary["built"] == len(built.manifest.volumes)
    # The cluster's own workers ran every file (the driver started no cluster of its own)...
    assert done["run_task"].state_counts["memory"] - before == summary["read"]
    # ...and produced exactly the same volumes (same keys, same checksums) and rejections.
    m = mf.load(tmp_path / "cache" / "manifest.json")
    assert m.volumes == built.manifest.volumes and m.rejected == built.manifest.rejected


def test_unreachable_scheduler_is_refused_with_exit_2(
    built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setattr(builddask, "SCHEDULER_TIMEOUT", "2s")
    cache = tmp_path / "cache"
    argv = ["build-cache", "--source", str(built.src), "--out", str(cache)]
    argv += ["--labels", str(built.src / "participants.tsv")]
    argv += ["--manifest", str(cache / "manifest.json")]
    argv += ["--shape", "8", "32", "32", "--scheduler", f"tcp://127.0.0.1:{port}"]
    assert main(argv) == 2
    assert not (cache / "manifest.json").exists()


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
    partial = record.to_dict()
    del partial["checksum"]
    with pytest.raises(ValueError, match="incomplete"):
        Record.from_dict(partial)


# ---- killed part way ----------------------------------------------------------------------


def visible_volumes(cache: Path) -> list[Path]:
    return [p for p in (cache / "volumes").glob("*/*") if not p.name.startswith(".")]


@pytest.mark.slow  # ~20 s on 2 busy cores: a subprocess build, a kill, and the resumed build
def test_kill_and_resume_leaves_nothing_half_written(
    synth_root: Path, tmp_path: Path, scheduler: str
) -> None:
    cache = tmp_path / "cache"
    shape = ("16", "64", "64")
    argv = [sys.executable, "-m", "octstage.cli", "build-cache", "--source", str(synth_root)]
    argv += ["--labels", str(synth_root / "participants.tsv"), "--out", str(cache)]
    argv += ["--manifest", str(cache / "manifest.json"), "--shape", *shape, "--workers", "2"]
    # Own session: SIGKILL reaches the driver, its nannies and its workers at once.
    proc = subprocess.Popen(
        argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 300
        while len(list((cache / "records").glob("*.json"))) < 4:
            assert proc.poll() is None, "build ended before it could be killed"
            assert time.monotonic() < deadline, "build never got going"
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    _wait_until_gone(proc.pid)
    assert not (cache / "manifest.json").exists()  # killed before the end: no manifest at all
    at_kill = visible_volumes(cache)
    assert at_kill
    for folder in at_kill:  # whatever is visible under its final name is complete
        array = volumestore.read_volume(cache, folder.relative_to(cache).as_posix())
        assert array.shape == tuple(int(s) for s in shape)
    for record in (cache / "records").glob("*.json"):
        assert (cache / json.loads(record.read_text())["zarr_path"] / "0" / "zarr.json").is_file()

    code, summary = build(synth_root, cache, BuildConfig(shape=(16, 64, 64)), scheduler=scheduler)
    assert code == 1
    assert summary["reused"] >= len(list((cache / "records").glob("*.json"))) - summary["built"]
    assert summary["built"] + summary["reused"] == summary["volumes"]
    assert summary["built"] < summary["volumes"]  # the killed run's volumes were kept
    assert not list((cache / "volumes").glob("*/.tmp-*"))  # leftovers of the kill cleaned
    report = verify(cache / "manifest.json")
    assert report.ok, report


def _wait_until_gone(session: int) -> None:
    """Every process of the killed build's session (driver, nannies, workers) has exited."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(session, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError("processes of the killed build are still running")


# ---- a bucket as the source ----------------------------------------------------------------


def test_build_from_a_gcs_bucket_matches_the_local_build(
    built: Built, synth_info: SynthInfo, cloud_env: dict[str, str], gcs_bucket: str, tmp_path: Path
) -> None:
    """Workers stream from fake-gcs-server (spooled to a temp file), same volumes as locally."""
    from octstage.storage import open_storage

    # A few participants' files (good ones and traps) and the labels, uploaded to the bucket.
    keep = set(synth_info.labelled[:12])
    names = [f for f in synth_info.files if f.split("/")[-2] in keep]
    bucket = open_storage(f"gs://{gcs_bucket}/aireadi")
    for name in [*names, "participants.tsv"]:
        bucket.write_bytes(name, (built.src / name).read_bytes())
    url = f"gs://{gcs_bucket}/aireadi"
    cache = tmp_path / "cache"
    code = run_build(url, f"{url}/participants.tsv", cache, cache / "m.json", CONFIG, workers=1)
    assert code == 1
    m = mf.load(cache / "m.json")
    local = {v.source_path: v for v in built.manifest.volumes if v.source_path in set(names)}
    assert {v.source_path: v for v in m.volumes} == local
    local_rejected = {r.source: r.reason for r in built.manifest.rejected if r.source in names}
    assert {r.source: r.reason for r in m.rejected} == local_rejected
    assert m.header.dataset == url

    # Unchanged objects (same size and MD5 in the listing): nothing read, nothing decoded.
    summary_path = tmp_path / "again.json"
    run_build(
        url, f"{url}/participants.tsv", cache, cache / "m.json", CONFIG, json_out=summary_path
    )
    summary = json.loads(summary_path.read_text())
    assert (summary["read"], summary["decoded"], summary["reused"]) == (0, 0, len(local))


def test_spool_hashes_in_one_pass_and_notices_a_rewrite(tmp_path: Path) -> None:
    from octstage.buildtask import spooled
    from octstage.storage import LocalStorage

    data = bytes(range(256)) * 50_000  # several read chunks
    (tmp_path / "a.dcm").write_bytes(data)
    with spooled(LocalStorage(tmp_path), "a.dcm") as spool:
        assert spool.sha1 == hashlib.sha1(data).hexdigest() and spool.size == len(data)
        assert spool.unchanged()
        path = tmp_path / "a.dcm"
        path.write_bytes(data[::-1])  # same size, new bytes
        os.utime(path, ns=(0, path.stat().st_mtime_ns + 1))
        assert not spool.unchanged()  # its SHA1 no longer describes what a decode would read
