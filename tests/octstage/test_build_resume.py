"""build-cache re-runs over an existing cache: reuse, what a change rebuilds, kill and resume.

Every test works on a copy of the shared build (``built`` in conftest.py) and runs on the
module's loopback dask cluster (``scheduler``).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import pydicom.data
import pytest
from pydicom.pixels.decoders.base import get_decoder
from pydicom.uid import RLELossless

from octstage import manifest as mf
from octstage.cache import volumestore
from octstage.cache.store import CacheStore
from octstage.cache.verify import verify
from octstage.cachebuild.sourceindex import INDEX_NAME
from octstage.cachebuild.task import REJECT_FORMAT, load_reject, reject_name
from octstage.config import BuildConfig
from octstage.dataset.synth import write_oct_dicom
from octstage.errors import ConfigError
from tests.octstage.build_helpers import (
    Built,
    build,
    copy_cache,
    rejected,
)


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
    # The first shape's volumes, replaced by this manifest, went with it: verify finds nothing
    # extra. Back to the first shape: decoded again, and the other shape's removed in turn.
    assert verify(cache / "manifest.json").ok
    _, summary = build(built.src, cache, scheduler=scheduler)
    assert summary["decoded"] == n
    report = verify(cache / "manifest.json")
    assert report.ok and not report.extra


def test_label_change_rebuilds_nothing(built: Built, tmp_path: Path, scheduler: str) -> None:
    src = tmp_path / "src"
    shutil.copytree(built.src, src)
    cache = copy_cache(built, tmp_path / "cache")
    (cache / "manifest.json").unlink()  # the source moved: the way out build-cache names
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
    (cache / "manifest.json").unlink()  # the source moved: the way out build-cache names
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


# ---- failures of the machine: reported, retried, never remembered ---------------------------


@pytest.fixture
def in_process() -> Iterator[str]:
    """A dask cluster whose worker is a thread of this process, so a monkeypatched decoder or
    disk is what the task really sees (the shared cluster's workers are other processes)."""
    from dask.distributed import LocalCluster

    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0"
    ) as local:
        yield str(local.scheduler_address)


def _compressed_victim(built: Built, cache: Path) -> mf.Volume:
    """A compressed volume whose record is dropped, so the next build must decode it again."""
    victim = next(v for v in built.manifest.volumes if v.transfer_syntax == RLELossless)
    (cache / "records" / f"{victim.cache_key}.json").unlink()
    return victim


def _assert_retried(built: Built, cache: Path, victim: mf.Volume, scheduler: str) -> None:
    """After the fault is gone, the next run builds the volume: nothing of the fault was kept."""
    assert not (cache / "rejects" / f"{victim.source_sha1}.json").exists()
    code, summary = build(built.src, cache, scheduler=scheduler)
    assert code == built.code == 1  # back to the deterministic exclusions only
    assert (summary["built"], summary["environment"]) == (1, 0)
    m = mf.load(cache / "manifest.json")
    assert m.volumes == built.manifest.volumes and rejected(m) == rejected(built.manifest)


def test_missing_decoder_plugin_is_retried_next_run(
    built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_process: str
) -> None:
    cache = copy_cache(built, tmp_path / "cache")
    victim = _compressed_victim(built, cache)
    # What pydicom sees when pylibjpeg-rle is not installed: the plugin is not available.
    decoder = get_decoder(RLELossless)
    available = {k: v for k, v in decoder._available.items() if k != "pylibjpeg"}
    monkeypatch.setattr(decoder, "_available", available)
    monkeypatch.setattr(decoder, "_unavailable", {"pylibjpeg": ("pylibjpeg-rle",)})
    code, summary = build(built.src, cache, scheduler=in_process)
    assert code == 3  # volumes missing for a reason a re-run may fix
    assert summary["environment"] == 1 and summary["rejected_by_reason"]["environment"] == 1
    reason = rejected(mf.load(cache / "manifest.json"))[victim.source_path]
    assert reason.startswith("environment: DICOM: no decoder for RLE Lossless"), reason
    monkeypatch.undo()  # the plugin is installed again
    _assert_retried(built, cache, victim, in_process)


def test_io_error_while_reading_is_retried_next_run(
    built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_process: str
) -> None:
    cache = copy_cache(built, tmp_path / "cache")
    victim = _compressed_victim(built, cache)
    real = pydicom.dcmread

    def flaky(fp: Any, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("stop_before_pixels"):  # the full read of the pixels fails
            raise OSError(errno.EIO, "Input/output error")
        return real(fp, *args, **kwargs)

    monkeypatch.setattr(pydicom, "dcmread", flaky)
    code, summary = build(built.src, cache, scheduler=in_process)
    assert code == 3 and summary["environment"] == 1
    reason = rejected(mf.load(cache / "manifest.json"))[victim.source_path]
    assert reason == "environment: DICOM: I/O error: Input/output error", reason
    monkeypatch.undo()
    _assert_retried(built, cache, victim, in_process)


def test_without_a_terminal_progress_lines_are_printed(
    built: Built,
    tmp_path: Path,
    scheduler: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = copy_cache(built, tmp_path / "cache")
    for volume in built.manifest.volumes[:3]:  # three volumes to build again, the rest reused
        (cache / "records" / f"{volume.cache_key}.json").unlink()
    monkeypatch.setenv("OCTSTAGE_PROGRESS_SECONDS", "0")  # captured stderr is no terminal
    build(built.src, cache, scheduler=scheduler)
    err = capsys.readouterr().err.splitlines()
    lines = [ln for ln in err if re.match(r"build-cache: \d+/", ln)]
    assert [ln.split(",")[0] for ln in lines] == [
        "build-cache: 1/3 (33%)",
        "build-cache: 2/3 (67%)",
        "build-cache: 3/3 (100%)",
    ]
    assert "ok 3 rejected 0" in lines[-1]
    monkeypatch.setenv("OCTSTAGE_PROGRESS_SECONDS", "soon")
    with pytest.raises(ConfigError, match="OCTSTAGE_PROGRESS_SECONDS"):
        build(built.src, cache, scheduler=scheduler)


def test_rejections_stored_before_verdicts_were_classified_are_decided_again(
    tmp_path: Path,
) -> None:
    """An older store could hold an environment failure as if it were a verdict: ignore it."""
    sha1 = "a" * 40
    name = "retinal_oct/structural_oct/heidelberg_spectralis/1001/1001_spectralis_mac_r_1.2.dcm"
    path = tmp_path / reject_name(sha1)
    path.parent.mkdir(parents=True)
    cache = CacheStore(str(tmp_path))
    old = {"sha1": sha1, "cache_version": mf.CACHE_VERSION, "reason": "DICOM: decode failed"}
    path.write_text(json.dumps({**old, "header": None}))
    assert load_reject(cache, sha1, name) is None
    path.write_text(json.dumps({**old, "header": None, "format": REJECT_FORMAT}))
    assert load_reject(cache, sha1, name) == "DICOM: decode failed"


def test_a_rebuild_in_the_columnar_form_lists_the_same_volumes(
    built: Built, tmp_path: Path
) -> None:
    cache = copy_cache(built, tmp_path / "cache")
    code, summary = build(built.src, cache, manifest_form="table")
    assert code == built.code and summary["decoded"] == 0
    m = mf.load(cache / "manifest.json")
    assert isinstance(m.volumes, mf.ItemTable)
    assert list(m.volumes) == list(built.manifest.volumes) and m.rejected == built.manifest.rejected
    assert m.split("train") == built.manifest.split("train")
    report = verify(cache / "manifest.json")
    assert report.ok and report.schema == "valid", report
