"""build-cache into a folder that holds another cache (or naming another cache's manifest) is
refused before any work, naming what the folder holds; a Cell Painting build that keeps nothing
exits 2 as its --help says and verify refuses the empty cache; an 8-bit TIFF among 16-bit ones is
a rejection naming both pixel types."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from octstage import manifest as mf
from octstage.dataset.synth import SynthInfo
from tests.badinput.conftest import Ran, assert_clean, tiny_build

CLI = Callable[..., Ran]


@pytest.fixture(scope="module")
def cp_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-plate twin of the release (24 fields, one site, 48 px), no planted traps: its
    dataset root (``.../cpg0016-jump``)."""
    from octstage.cellpainting.synth import generate

    out = tmp_path_factory.mktemp("cp")
    info = generate(out, plates=1, sites=1, size=48, seed=5, traps=False)
    return out / info.dataset


def _cp_build(source: Path, out: Path, *extra: str | Path) -> tuple[str | Path, ...]:
    # the tables name s3://cellpainting-gallery/cpg0016-jump/...: mapped onto this copy
    return ("build-cache", "--kind", "cellpainting", "--source", source, "--out", out,
            "--workers", "1", "--map-prefix",
            f"s3://cellpainting-gallery/cpg0016-jump/={source}/", *extra)  # fmt: skip


def test_build_cache_over_another_cache_is_refused(
    octstage_cli: CLI, source: Path, cp_source: Path, tmp_path: Path
) -> None:
    labels = source / "participants.tsv"
    a = tmp_path / "a"
    assert octstage_cli(*tiny_build(source, labels, a)).code in (0, 1)
    before = (a / "manifest.json").read_bytes()
    # --manifest naming the manifest of the cache in a/, from a build into b/
    ran = octstage_cli(
        *tiny_build(source, labels, tmp_path / "b"), "--manifest", a / "manifest.json"
    )
    assert_clean(ran, 2, a / "manifest.json", "another cache", "none of them in")
    # a Cell Painting build into the OCT cache's folder
    ran = octstage_cli(*_cp_build(cp_source, a))
    assert_clean(ran, 2, a / "manifest.json", "a oct cache", "this build writes a cellpainting")
    assert (a / "manifest.json").read_bytes() == before
    assert not (a / "fields").exists()
    # the same cache built again is brought up to date in place, as always
    assert octstage_cli(*tiny_build(source, labels, a)).code in (0, 1)


def test_build_cache_over_a_staged_cache_of_another_dataset_is_refused_and_leaves_no_stale_table(
    octstage_cli: CLI, tiny_source: SynthInfo, source: Path, tmp_path: Path
) -> None:
    labels = source / "participants.tsv"
    built, staged = tmp_path / "built", tmp_path / "staged"
    args = tiny_build(tiny_source.root, labels, built)
    assert octstage_cli(*args, "--manifest-form", "table").code in (0, 1)
    assert octstage_cli("stage", built, staged).code == 0

    def files() -> dict[Path, bytes]:  # the build's lock file aside
        return {p: p.read_bytes() for p in staged.rglob("*") if p.is_file() and p.suffix != ".lock"}

    before = files()
    # Another dataset (here a copy elsewhere) into the staged cache: every item of the staged
    # manifest is present, yet its manifest and item table would be replaced.
    ran = octstage_cli(*tiny_build(source, labels, staged))
    assert_clean(ran, 2, staged / "manifest.json", "another cache", str(tiny_source.root),
                 f"this build reads '{source}'", "manifest.items.parquet aside")  # fmt: skip
    assert files() == before
    # The same cache rebuilt in the JSON form: no item table is left beside the new manifest.
    assert octstage_cli(*args).code in (0, 1)
    assert not (built / "manifest.items.parquet").exists()
    assert mf.load(built / "manifest.json").volumes


def test_a_cell_painting_build_that_keeps_nothing_exits_2_and_verify_refuses_it(
    octstage_cli: CLI, cp_source: Path, tmp_path: Path
) -> None:
    import shutil

    src = Path(shutil.copytree(cp_source, tmp_path / "cpg0016-jump"))
    for tiff in src.rglob("*.tiff"):
        tiff.write_bytes(b"<html>503</html>")
    out = tmp_path / "cache"
    ran = octstage_cli(*_cp_build(src, out))
    assert_clean(ran, 2, "nothing kept")
    assert mf.load(out / "manifest.json").fields == ()
    verified = octstage_cli("verify", out / "manifest.json")
    assert_clean(verified, 1, "lists no fields")
    assert "PROBLEMS" in verified.text


def test_an_8_bit_channel_among_16_bit_ones_is_a_rejection_naming_both(
    octstage_cli: CLI, cp_source: Path, tmp_path: Path
) -> None:
    import shutil

    import tifffile

    src = Path(shutil.copytree(cp_source, tmp_path / "cpg0016-jump"))
    dna = sorted(src.rglob("*-ch1*.tif*"))
    for t in dna:  # the DNA channel 8-bit in every field: the plate alone would not tell
        image = tifffile.imread(t)
        assert image.dtype == np.uint16
        tifffile.imwrite(t, (image >> 8).astype(np.uint8))
    out = tmp_path / "cache"
    ran = octstage_cli(*_cp_build(src, out))
    assert_clean(ran, 2, "channels differ in pixel type", f"{dna[0].name} uint8", "uint16")
    assert mf.load(out / "manifest.json").fields == ()


def test_a_whole_8_bit_field_among_16_bit_fields_is_a_rejection(
    octstage_cli: CLI, cp_source: Path, tmp_path: Path
) -> None:
    import shutil

    import tifffile

    src = Path(shutil.copytree(cp_source, tmp_path / "cpg0016-jump"))
    tiffs = sorted(src.rglob("*.tif*"))
    field = [t for t in tiffs if t.name.split("-")[0] == tiffs[0].name.split("-")[0]]
    for t in field:  # every channel of one field 8-bit: the plate's percentiles would not fit
        tifffile.imwrite(t, (tifffile.imread(t) >> 8).astype(np.uint8))
    out = tmp_path / "cache"
    ran = octstage_cli(*_cp_build(src, out))
    assert_clean(ran, 1, "pixel type uint8, the plate's other fields are uint16")
    assert {f.source_dtype for f in mf.load(out / "manifest.json").fields} == {"uint16"}
