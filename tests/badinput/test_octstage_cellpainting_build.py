"""A Cell Painting build (and the synth that makes its twin) says what a user would otherwise
find out later: no --metadata (nothing to score), more --processes than plates or cores, a
--select-plate of no plate there (the plates there are listed), an earlier build's arrays its
new manifest replaced (removed, so verify is clean), a twin of other parameters in synth's
folder (refused without --overwrite), a twin with no test split, and a FIFO in the cache
(verify names it instead of hanging)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import tifffile

from tests.badinput.conftest import Ran, assert_clean

CLI = Callable[..., Ran]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-plate twin (24 fields, one site, 40 px), no planted traps: its folder."""
    from octstage.cellpainting.synth import generate

    out = tmp_path_factory.mktemp("cpbuild") / "twin"
    generate(out, plates=1, sites=1, size=40, seed=3, traps=False, replicates=1)
    return out


def _build(source: Path, out: Path, *extra: str | Path) -> tuple[str | Path, ...]:
    # the tables name s3://cellpainting-gallery/cpg0016-jump/...: mapped onto this copy
    return ("build-cache", "--kind", "cellpainting", "--source", source, "--out", out,
            "--workers", "1", "--map-prefix",
            f"s3://cellpainting-gallery/cpg0016-jump/={source}/", *extra)  # fmt: skip


def test_a_build_without_metadata_says_its_fields_carry_no_labels(
    octstage_cli: CLI, twin: Path, tmp_path: Path
) -> None:
    ran = octstage_cli(*_build(twin / "cpg0016-jump", tmp_path / "c"))
    assert_clean(ran, 0, "no --metadata", "no perturbation or control labels",
                 "`octtrain profile` cannot score", "pass --metadata")  # fmt: skip
    labelled = octstage_cli(
        *_build(twin / "cpg0016-jump", tmp_path / "d", "--metadata", twin / "datasets/metadata")
    )
    assert labelled.code == 0 and "no --metadata" not in labelled.text


def test_a_plate_not_there_is_refused_listing_the_plates_there(
    octstage_cli: CLI, twin: Path, tmp_path: Path
) -> None:
    from octstage.cellpainting.synth import plate_name

    ran = octstage_cli(*_build(twin / "cpg0016-jump", tmp_path / "c", "--select-plate", "BR_NOPE"))
    assert_clean(ran, 2, "--select-plate BR_NOPE", "1 plate(s)", plate_name(0))
    assert not (tmp_path / "c" / "manifest.json").exists()


def test_more_processes_than_plates_or_cores_are_capped_and_said(
    octstage_cli: CLI, twin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """64 processes for one plate: one starts (the dask run itself is another test's)."""
    from octstage.cellpainting import build

    started: list[int] = []
    monkeypatch.setattr(build, "usable_cores", lambda: 2)
    monkeypatch.setattr(
        build, "build_on_cluster", lambda *a: started.append(a[8].processes)
    )  # builds nothing: the manifest lists no field (exit 2)
    ran = octstage_cli(*_build(twin / "cpg0016-jump", tmp_path / "c", "--processes", "64"))
    assert_clean(ran, 2, "--processes 64: 1 plate(s) on 2 core(s): starting 1 worker process")
    assert started == [1]


def test_a_rebuild_after_a_changed_tiff_removes_the_arrays_it_replaced(
    octstage_cli: CLI, twin: Path, tmp_path: Path
) -> None:
    """A field whose TIFF changed is stored anew (its plate's too, where the percentiles move):
    the earlier manifest's arrays it replaced go, so verify finds nothing extra."""
    src = Path(shutil.copytree(twin, tmp_path / "twin")) / "cpg0016-jump"
    cache = tmp_path / "c"
    for pack in ((), ("--pack", "8")):
        out = cache / (pack[-1] if pack else "1")
        assert octstage_cli(*_build(src, out, *pack)).code == 0
        before = {p.name for p in out.rglob("*.zarr")}
        tiff = sorted(src.rglob("*.tif*"))[0]
        tifffile.imwrite(tiff, tifffile.imread(tiff) // 2 + 1, photometric="minisblack")
        ran = octstage_cli(*_build(src, out, *pack))
        assert_clean(ran, 0, "removed", "of the earlier manifest that this one replaces")
        assert octstage_cli("verify", out / "manifest.json").code == 0
        assert before - {p.name for p in out.rglob("*.zarr")}  # some went


def test_synth_over_a_twin_of_other_parameters_needs_overwrite(
    octstage_cli: CLI, tmp_path: Path
) -> None:
    out = tmp_path / "twin"
    args = ("synth", "--kind", "cellpainting", out, "--plates", "1", "--sites", "1",
            "--size", "32", "--no-traps")  # fmt: skip
    assert octstage_cli(*args).code == 0
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*.tif*")}
    ran = octstage_cli(*args, "--seed", "1")
    assert_clean(ran, 2, out, "holds another twin", "seed=0", "seed=1", "--overwrite")
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.tif*")} == stamps
    again = octstage_cli(*args)  # the same parameters: the same bytes, said
    assert_clean(again, 0, "writing again (same parameters, same bytes)")
    assert_clean(octstage_cli(*args, "--seed", "1", "--overwrite"), 0, "replacing the twin")
    oct_ran = octstage_cli("synth", out, "--participants", "4", "--no-traps", "--overwrite")
    assert_clean(oct_ran, 2, out, "not made by octstage synth")  # never the other kind


def test_an_oct_twin_without_a_test_split_says_so(octstage_cli: CLI, tmp_path: Path) -> None:
    ran = octstage_cli("synth", tmp_path / "t", "--participants", "16", "--no-traps")
    assert_clean(ran, 0, "16 participants give no test split", "train 12, val 4, test 0",
                 "--participants 25 or more")  # fmt: skip
    full = octstage_cli("synth", tmp_path / "u", "--participants", "25", "--no-traps")
    assert full.code == 0 and "give no" not in full.text


def test_verify_names_a_chunk_replaced_by_a_fifo_instead_of_hanging(
    octstage_cli: CLI, twin: Path, tmp_path: Path
) -> None:
    """Opening a FIFO blocks until a writer comes: verify runs in a subprocess here, so a
    regression is a timeout, not a hung test run."""
    out = tmp_path / "c"
    for pack, where in (((), "fields"), (("--pack", "8"), "packs")):
        shutil.rmtree(out, ignore_errors=True)
        assert octstage_cli(*_build(twin / "cpg0016-jump", out, *pack)).code == 0
        shard = next(p for p in sorted((out / where).rglob("*")) if "/c/" in p.as_posix())
        while shard.is_dir():
            shard = sorted(shard.iterdir())[0]
        shard.unlink()
        os.mkfifo(shard)
        done = subprocess.run(
            [sys.executable, "-m", "octstage.cli", "verify", str(out / "manifest.json")],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "1000"},
        )
        text = " ".join((done.stdout + done.stderr).split())
        assert done.returncode == 1, text
        assert "Traceback" not in text
        assert f"missing {shard.relative_to(out).parents[-4].as_posix()}" in text, text
        assert f"{shard.relative_to(out).as_posix()}: not a regular file" in text, text
