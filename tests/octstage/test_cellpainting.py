"""Cell Painting staged as OCT is: the JUMP-layout twin served from the S3 double (moto, real
HTTP) is built into a cache, verify and stage pass, a TLS error on one object is an environment
failure (exit 3, nothing rejected) and the next run retries it; bad TIFFs are rejections."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import ssl
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pytest
import zarr

from octstage import manifest as mf
from octstage.cache.verify import verify
from octstage.cellpainting import layout
from octstage.cellpainting.build import build, exit_code, find_tables, plate_splits
from octstage.cellpainting.families import PHENOTYPES
from octstage.cellpainting.metadata import DMSO
from octstage.cellpainting.normalize import decode_tiff, histogram, plate_normalization, to_uint8
from octstage.cellpainting.plate import CellPaintingConfig
from octstage.cellpainting.synth import TwinInfo, generate
from octstage.cli import main
from octstage.errors import CellPaintingError
from octstage.stage import run_stage
from octstage.storage import ObjectInfo, Storage, open_storage
from tests.doubles.s3 import S3Double
from tests.octstage.conftest import CP_SIZE


class FlakyStorage:
    """The real S3 backend, except that reads of ``name`` fail ``times`` times with the TLS
    error the users saw, mapped to StorageError by the backend's own ``fail`` (as s3fs would)."""

    def __init__(self, inner: Storage, name: str, times: int, after: int = 0) -> None:
        self.inner, self.name, self.left = inner, name, times
        self.url = inner.url
        self.calls = 0
        self.after = after  # reads that succeed before the failures start

    def read_bytes(self, name: str) -> bytes:
        if name == self.name:
            self.calls += 1
            if self.calls > self.after and self.left > 0:
                self.left -= 1
                exc = ssl.SSLError(
                    1, "[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1000)"
                )
                raise self.inner.fail(name, exc)  # type: ignore[attr-defined]
        return self.inner.read_bytes(name)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self.inner.list(prefix)

    def stat(self, name: str) -> ObjectInfo:
        return self.inner.stat(name)

    def open(self, name: str, chunk_size: int | None = None) -> BinaryIO:
        return self.inner.open(name, chunk_size)

    def write_bytes(
        self, name: str, data: bytes, metadata: Mapping[str, str] | None = None
    ) -> None:
        self.inner.write_bytes(name, data, metadata)

    def delete(self, name: str) -> None:
        self.inner.delete(name)


def test_plate_splits_never_share_a_plate() -> None:
    plates = [f"BR{i:05d}" for i in range(10)]
    splits = plate_splits(plates, 0.2, 0.1)
    assert sorted(splits) == plates  # one split per plate, by construction of the mapping
    assert sorted(splits.values()).count("val") == 2 and list(splits.values()).count("test") == 1
    assert set(plate_splits(["P1", "P2"], 0.25, 0.0).values()) == {"train", "val"}
    assert plate_splits(["P1"], 0.25, 0.0) == {"P1": "train"}


def test_normalization_is_per_channel_robust_percentiles() -> None:
    rng = np.random.default_rng(0)
    field = np.stack([rng.uniform(100, 200, (32, 32)), rng.uniform(1000, 5000, (32, 32))]).astype(
        np.float32
    )
    field[0, 0, 0] = 6e4  # one hot pixel must not set the range
    norms = plate_normalization(histogram(field), 1.0, 99.0)
    assert (
        100 <= norms[0].low < norms[0].high <= 200 and 1000 <= norms[1].low < norms[1].high <= 5000
    )
    out = to_uint8(field, norms)
    assert out.dtype == np.uint8 and out[0, 0, 0] == 255 and out.min() == 0


def test_a_bad_tiff_is_a_rejection_naming_the_file() -> None:
    with pytest.raises(CellPaintingError, match=r"x\.tiff: not a readable TIFF"):
        decode_tiff(b"<html>503</html>", "x.tiff")


def test_a_load_data_table_without_a_channel_column_is_refused_naming_it() -> None:
    rows = [{"Metadata_Plate": "P1", "Metadata_Well": "A01", "Metadata_Site": "1"}]
    with pytest.raises(
        CellPaintingError, match=r"t\.csv: missing column\(s\) URL_OrigDNA or FileName_OrigDNA"
    ):
        layout.parse_load_data(rows, "t.csv", "/root")


def test_absolute_path_names_must_lie_under_the_source_root() -> None:
    root = "s3://cellpainting-gallery/cpg0016-jump/source_4"
    assert (
        layout.relative_name(f"{root}/images/B/images/P/", "a.tiff", root)
        == "images/B/images/P/a.tiff"
    )
    with pytest.raises(CellPaintingError, match=r"not under the source root.*--map-prefix"):
        layout.relative_name("s3://elsewhere/images/", "a.tiff", root)
    # A mirror or local copy: the prefix map rewrites the release's URLs onto it.
    prefixes = layout.PrefixMap.parse([f"{root}/=/data/jump/source_4/"])
    assert (
        layout.relative_name(f"{root}/images/B/images/P/", "a.tiff", "/data/jump", prefixes)
        == "source_4/images/B/images/P/a.tiff"
    )
    # A relative root and an absolute target (or the reverse) name the same folder.
    here = layout.PrefixMap.parse([f"{root}/={Path.cwd()}/jump/source_4/"])
    assert (
        layout.relative_name(f"{root}/images/B/images/P/", "a.tiff", "jump", here)
        == "source_4/images/B/images/P/a.tiff"
    )
    rel = layout.PrefixMap.parse([f"{root}/=jump/source_4/"])
    assert (
        layout.relative_name(f"{root}/images/P/", "a.tiff", f"{Path.cwd()}/jump/", rel)
        == "source_4/images/P/a.tiff"
    )


def test_twin_builds_from_s3_into_a_verified_cache_that_stages(
    s3_twin: str, twin: tuple[Path, TwinInfo], tmp_path: Path, s3_server: S3Double
) -> None:
    root, info = twin
    cache = tmp_path / "cache"
    rc = main(
        ["build-cache", "--kind", "cellpainting", "--source", s3_twin, "--out", str(cache),
         "--metadata", str(root.parent / info.metadata), "--json", str(tmp_path / "r.json")]
    )  # fmt: skip
    assert rc == 1  # the planted truncated TIFF, and nothing else, is rejected
    m = mf.load(cache / "manifest.json")
    assert m.kind == "cellpainting" and m.volumes == ()
    assert len(m.fields) == info.fields - 1
    assert [r.reason for r in m.rejected] == [
        f"{info.truncated[0]}: not a readable TIFF: " + m.rejected[0].reason.split("TIFF: ")[1]
    ]
    # Splits by plate; labels index the perturbations; controls marked.
    assert all(len({f.split for f in m.fields if f.plate == p}) == 1 for p in info.plates)
    assert {f.split for f in m.fields} == {"train", "val"}
    assert set(m.classes) == set(PHENOTYPES)
    assert all(f.label is not None and m.classes[f.label] == f.perturbation for f in m.fields)
    assert {f.is_control for f in m.fields if f.perturbation == DMSO} == {True}
    # Types joined from the datasets tables: controls from perturbation_control.csv, the rest
    # from the table that lists the id.
    assert {f.perturbation: f.perturbation_type for f in m.fields} == {
        p: kind for p, (kind, _, _) in PHENOTYPES.items()
    }
    f = m.fields[0]
    assert f.shape == (5, CP_SIZE, CP_SIZE) and f.channels == layout.CHANNELS and len(f.illum) == 5
    assert f.sources[0].path.startswith(f"{f.source}/images/") and f.source_dtype == "uint16"
    assert {g.source for g in m.fields} == set(info.sources)
    # The SHA1 recorded is the source object's.
    bucket = s3_twin.split("/")[2]
    raw = s3_server.client().get_object(Bucket=bucket, Key=f"cpg0016-jump/{f.sources[3].path}")
    assert hashlib.sha1(raw["Body"].read()).hexdigest() == f.sources[3].sha1
    # Every channel uses its range: normalization per plate and channel.
    arr = zarr.open_array(str(cache / f.array_path), mode="r")
    assert arr.chunks == (5, 64, 64) and arr.dtype == np.uint8
    assert all(np.asarray(arr[c]).max() > 100 for c in range(5))
    stored = np.asarray(arr[:]).reshape(5, -1)  # recorded per channel, for the trainer's input
    assert f.intensity is not None
    assert f.intensity.mean == pytest.approx(tuple(stored.mean(axis=1)), abs=1e-3)
    assert f.intensity.std == pytest.approx(tuple(stored.std(axis=1)), abs=1e-3)
    report = verify(cache / "manifest.json")
    assert report.ok and report.verified == len(m.fields) and report.schema == "valid"
    assert report.kind == "cellpainting"  # its summary counts fields, not volumes
    # Stage from a bucket copy of the cache, verified.
    client = s3_server.client()
    for path in sorted(p for p in cache.rglob("*") if p.is_file()):
        client.put_object(
            Bucket=bucket, Key=f"cache/{path.relative_to(cache)}", Body=path.read_bytes()
        )
    staged = tmp_path / "staged"
    assert run_stage(f"s3://{bucket}/cache", staged) == 0
    assert mf.load(staged / "manifest.json") == m
    assert verify(staged / "manifest.json").ok


def test_a_tls_error_is_an_environment_failure_retried_on_the_next_run(
    s3_twin: str, twin: tuple[Path, TwinInfo], tmp_path: Path
) -> None:
    root, info = twin
    meta = str(root.parent / info.metadata)
    inner = open_storage(s3_twin)
    # The bad object: the first plate's first field's ER image.
    first = _rows(s3_twin)[0]
    victim = first.images[2][1]
    flaky = FlakyStorage(inner, victim, times=10)
    cache2 = tmp_path / "cache2"
    report, built_m = build(flaky, cache2, metadata=meta, retries=2)
    m = built_m.load()
    assert exit_code(report) == 3
    assert flaky.calls == 3  # tried, then retried twice in the run
    assert [e["source"] for e in report.environment] == [next(r for r in _rows(s3_twin)).item_id]
    assert (
        "SSL" in report.environment[0]["reason"]
        and "WRONG_VERSION_NUMBER" in report.environment[0]["reason"]
    )
    assert report.plates_left_out == [first.plate]
    assert all("SSL" not in r.reason for r in m.rejected)  # never called a bad file
    assert {f.plate for f in m.fields} == set(info.plates) - {first.plate}
    written = report.written
    # The next run (the network healthy again) retries it and keeps what was done.
    report2, built_m2 = build(inner, cache2, metadata=meta)
    m2 = built_m2.load()
    assert exit_code(report2) == 1 and not report2.environment  # only the planted bad TIFF
    assert len(m2.fields) == info.fields - 1 and report2.kept == written
    assert verify(cache2 / "manifest.json").ok


def test_a_transient_tls_error_is_retried_within_the_run(s3_twin: str, tmp_path: Path) -> None:
    inner = open_storage(s3_twin)
    victim = _rows(s3_twin)[0].images[0][1]
    flaky = FlakyStorage(inner, victim, times=1)
    report, built_m = build(flaky, tmp_path / "c", config=CellPaintingConfig(), retries=2)
    m = built_m.load()
    # failed, retried in the run (pass 1), then read once more to be written (pass 2)
    assert flaky.calls == 3 and not report.environment
    assert any(f.sources[0].path == victim for f in m.fields)


def test_the_cli_says_exit_3_for_an_unreadable_object(
    tmp_path: Path, twin: tuple[Path, TwinInfo]
) -> None:
    """An illum file that is a folder (EISDIR on read): an OS error, not a data fault."""
    root, info = twin
    copy = tmp_path / "src"
    shutil.copytree(root, copy)
    illum = next(copy.glob(f"*/images/*/illum/{info.plates[1]}/*IllumDNA.npy"))
    illum.unlink()
    illum.mkdir()
    rc = main(
        [
            "build-cache",
            "--kind",
            "cellpainting",
            "--source",
            str(copy),
            "--out",
            str(tmp_path / "c"),
            "--map-prefix",
            f"s3://{info.bucket}/cpg0016-jump/={copy}/",
        ]
    )
    assert rc == 3
    m = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert {f["plate"] for f in m["fields"]} == {info.plates[0]} and m["rejected"] == []


def _rows(url: str) -> list[layout.FieldRow]:
    storage = open_storage(url)
    name = find_tables(storage)[0]
    return layout.parse_load_data(
        layout.read_table(storage.read_bytes(name), name), name, storage.url
    )


def test_synth_cli_writes_the_release_layout(tmp_path: Path) -> None:
    out = tmp_path / "twin"
    assert main(["synth", "--kind", "cellpainting", str(out), "--plates", "2", "--sites", "1",
                 "--size", "48", "--no-traps"]) == 0  # fmt: skip
    root = out / "cpg0016-jump"
    tables = find_tables(open_storage(str(root)))
    assert [t.rpartition("/")[2] for t in tables] == ["load_data_with_illum.parquet"] * 2
    prefixes = layout.PrefixMap.parse([f"s3://cellpainting-gallery/cpg0016-jump/={root}/"])
    for table in tables:
        data = (root / table).read_bytes()
        rows = layout.parse_load_data(layout.read_table(data, table), table, str(root), prefixes)
        # the CSV beside the parquet says the same
        csv = table.replace(".parquet", ".csv")
        assert rows == layout.parse_load_data(
            layout.read_table((root / csv).read_bytes(), csv), csv, str(root), prefixes
        )
        assert len(rows) == 24 and {r.well for r in rows} == {
            f"{r}{c:02d}" for r in "ABCD" for c in range(1, 7)
        }
        image = decode_tiff((root / rows[0].images[0][1]).read_bytes(), "dna")
        assert image.dtype == np.uint16 and image.shape == (48, 48)
        assert np.load(root / rows[0].illum[0][1]).shape == (48, 48)
    cv8000, phenix = (
        sorted(r.images[0][1] for r in _table_rows(root, t, prefixes)) for t in tables
    )
    assert phenix[0].startswith("source_4/images/2021_04_26_Batch1/images/BR00117035__2021-")
    assert "-Measurement1/Images/r01c01f01p01-ch5sk1fk1fl1.tiff" in phenix[0]  # DNA is ch5
    assert cv8000[0] == (  # DNA is C01 on a CV8000 (channel_mapping.csv, source 10)
        "source_10/images/2021_05_31_U2OS_48_hr_run1/images/Dest210532-152149/"
        "Dest210532-152149_A01_T0001F001L01A01Z01C01.tif"
    )


def test_the_twin_has_every_microscope_of_the_release_and_each_builds_and_verifies(
    tmp_path: Path,
) -> None:
    """A plate per microscope, each keyed as the release keys it: an Opera Phenix, a CV8000
    whose action and channel numbers differ (source 10: AGP is ``A03Z01C04``), source 3's
    Phenix in a ``Measurement 1`` folder and an ImageXpress; ``microscope_config.csv`` as
    released. build-cache reads every plate (channels from the tables, never the names) and the
    cache verifies."""
    out = tmp_path / "twin"
    info = generate(out, plates=4, sites=1, size=32, replicates=1, traps=False)
    assert info.sources == ("source_4", "source_10", "source_3", "source_8")
    root = out / info.dataset
    keys = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.tif*"))
    of = {s: [k for k in keys if k.startswith(f"{s}/")] for s in info.sources}
    uuid = "[0-9A-F]{8}-[0-9A-F]{4}-4[0-9A-F]{3}-[89AB][0-9A-F]{3}-[0-9A-F]{12}"
    imagexpress = rf"source_8/images/J1/images/(A\d+)/Images/HTS_[A-P]\d\d_s1_w[1-5]{uuid}\.tif"
    assert of["source_8"] and all(re.fullmatch(imagexpress, k) for k in of["source_8"])
    actions = {re.search(r"L01A(\d\d)Z01C(\d\d)\.tif$", k).groups() for k in of["source_10"]}  # type: ignore[union-attr]
    assert actions == {("01", "01"), ("01", "02"), ("02", "03"), ("03", "04"), ("03", "05")}
    assert of["source_3"] and all("-Measurement 1/Images/" in k for k in of["source_3"])
    config = (out / info.metadata / "microscope_config.csv").read_text().splitlines()
    assert config[0].split(",")[:3] == [
        "Metadata_Source", "Metadata_Microscope_Name", "Metadata_Widefield_vs_Confocal"
    ]  # fmt: skip
    assert "source_8,ImageXpress Micro Confocal,Confocal,LED,0.75,0,0,3,9,E,0.7032" in config
    assert [row.split(",")[0] for row in config[1:]] == list(info.sources)
    prefixes = layout.PrefixMap.parse([f"s3://{info.bucket}/{info.dataset}/={root}/"])
    cache = tmp_path / "cache"
    m = build(str(root), cache, metadata=str(out / info.metadata), prefixes=prefixes)[1].load()
    assert len(m.fields) == info.fields and not m.rejected
    assert {f.source for f in m.fields} == set(info.sources)
    for f in m.fields:  # DNA first, whatever the microscope numbers it
        dna = f.sources[0].path
        assert f.sources[0].channel == "DNA"
        assert dna.endswith(("-ch5sk1fk1fl1.tiff", "Z01C01.tif")) or "_w5" in dna, dna
    assert verify(cache / "manifest.json").ok


def _table_rows(root: Path, table: str, prefixes: layout.PrefixMap) -> list[layout.FieldRow]:
    data = (root / table).read_bytes()
    return layout.parse_load_data(layout.read_table(data, table), table, str(root), prefixes)


@pytest.mark.parametrize(
    ("kind", "extra", "named"),
    [
        ("cellpainting", ["--labels", "participants.tsv"], "--labels: only for --kind oct"),
        ("cellpainting", ["--concept", "3004410", "--from-tsv"], "--from-tsv, --concept"),
        ("oct", ["--labels", "p.tsv", "--metadata", "m.csv"], "--metadata: only for --kind cell"),
        ("oct", ["--labels", "p.tsv", "--pack", "8"], "--pack: only for --kind cellpainting"),
        ("oct", ["--labels", "p.tsv", "--processes", "2"], "--processes: only for --kind cell"),
        # Not an option of the other kind, but the same rule: never one of two silently ignored.
        ("cellpainting", ["--processes", "2", "--scheduler", "tcp://h:1"], "give one of them"),
    ],
)
def test_an_option_of_the_other_kind_is_refused_not_ignored(
    kind: str, extra: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["build-cache", "--kind", kind, "--source", str(tmp_path), "--out", str(tmp_path / "c")]
    assert main([*args, *extra]) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_build_cache_writes_the_columnar_form_when_asked(
    s3_twin: str, twin: tuple[Path, TwinInfo], tmp_path: Path
) -> None:
    root, info = twin
    cache = tmp_path / "cache"
    rc = main(
        ["build-cache", "--kind", "cellpainting", "--source", s3_twin, "--out", str(cache),
         "--metadata", str(root.parent / info.metadata), "--manifest-form", "table"]
    )  # fmt: skip
    assert rc == 1  # the planted truncated TIFF
    header = json.loads((cache / "manifest.json").read_text())
    assert header["schema_version"] == 2 and "fields" not in header
    m = mf.load(cache / "manifest.json")
    assert isinstance(m.fields, mf.ItemTable) and len(m.fields) == info.fields - 1
    assert header["table"]["rows"] == len(m.fields)
    assert mf.check(m, "cellpainting") == []
    report = verify(cache / "manifest.json")
    assert report.ok and report.schema == "valid" and report.verified == len(m.fields)


def test_a_plate_whose_second_pass_fails_lists_none_of_its_fields(
    s3_twin: str, twin: tuple[Path, TwinInfo], tmp_path: Path
) -> None:
    """The plate's fields already written when pass 2 fails are in the spool: the plate is left
    out whole (its percentiles need all its fields), none of its fields in the manifest."""
    root, info = twin
    inner = open_storage(s3_twin)
    rows = _rows(s3_twin)
    plate = rows[0].plate
    bad = {name.rpartition("/")[2] for name in info.truncated}  # rejected in pass 1
    last = [
        r
        for r in rows
        if r.plate == plate and not any(n.rpartition("/")[2] in bad for _, n in r.images)
    ][-1]  # written after the plate's other fields
    flaky = FlakyStorage(inner, last.images[0][1], times=10, after=1)  # pass 1 reads it fine
    report, built = build(
        flaky, tmp_path / "c", metadata=str(root.parent / info.metadata), retries=0
    )
    assert exit_code(report) == 3 and report.plates_left_out == [plate]
    assert report.written > 0  # other fields of the plate were written before the fault
    m = built.load()
    assert m.fields and plate not in {f.plate for f in m.fields}
    assert m.header.counts["by_plate"].get(plate) is None


def test_synth_of_the_twin_writes_only_into_an_empty_folder_or_its_own_twin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As the OCT twin: a folder holding anything synth did not write is refused untouched; its
    own twin is written again from scratch (no plate of a larger earlier twin stays)."""
    args = ["--plates", "2", "--sites", "1", "--size", "32", "--no-traps"]
    document = tmp_path / "notes"
    document.mkdir()
    (document / "paper.md").write_text("mine")
    assert main(["synth", "--kind", "cellpainting", str(document), *args]) == 2
    assert "was not made by octstage synth --kind cellpainting" in capsys.readouterr().err
    assert [p.name for p in document.iterdir()] == ["paper.md"]
    oct_twin = tmp_path / "oct"
    assert main(["synth", str(oct_twin), "--participants", "4", "--no-traps"]) == 0
    assert main(["synth", "--kind", "cellpainting", str(oct_twin), *args]) == 2
    twin = tmp_path / "twin"
    assert main(["synth", "--kind", "cellpainting", str(twin), *args]) == 0
    first = {p.name for p in twin.rglob("*.tif*")}
    smaller = ["synth", "--kind", "cellpainting", str(twin), *args[:1], "1", *args[2:]]
    assert main(smaller) == 2  # another twin's parameters: replaced only when asked
    assert {p.name for p in twin.rglob("*.tif*")} == first
    assert main([*smaller, "--overwrite"]) == 0
    again = {p.name for p in twin.rglob("*.tif*")}
    assert again and again < first
