"""The release as it is: tables in the forms the gallery ships (parquet with only ``URL_*``
columns, ``.csv.gz``), ``s3://`` paths mapped onto a local copy, the datasets repository's
metadata tables joined as given, selection by source/batch/plate/type, anonymous reads of a
public bucket, exact percentiles from histograms, the bounded read window; bad or inconsistent
tables stop with file, row and column, and leave what was built alone."""

from __future__ import annotations

import gzip
import json
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

from octstage import manifest as mf
from octstage.bounded import bounded_map
from octstage.cellpainting import layout
from octstage.cellpainting.build import Selection, build, find_tables
from octstage.cellpainting.families import PHENOTYPES
from octstage.cellpainting.metadata import DMSO, TABLES
from octstage.cellpainting.normalize import (
    correct,
    decode_illum,
    decode_tiff,
    histogram,
    percentile,
    to_uint8,
)
from octstage.cellpainting.synth import TwinInfo, plate_name
from octstage.cli import main
from octstage.errors import CellPaintingError, ConfigError
from octstage.storage import ObjectInfo, Storage, open_storage
from tests.doubles.fixtures import clear_client_caches
from tests.doubles.s3 import S3Double


@pytest.fixture
def copy(twin: tuple[Path, TwinInfo], tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """A local copy of the release (the twin): its root, its metadata folder, and the
    --map-prefix that maps the tables' s3:// URLs onto it."""
    root, info = twin
    dst = tmp_path / "jump"
    shutil.copytree(root, dst / "cpg0016-jump")
    shutil.copytree(root.parent / info.metadata, dst / "metadata")
    local = dst / "cpg0016-jump"
    return local, dst / "metadata", [f"s3://{info.bucket}/cpg0016-jump/={local}/"]


def _prefixes(spec: list[str]) -> layout.PrefixMap:
    return layout.PrefixMap.parse(spec)


def test_a_parquet_table_with_only_url_columns_stages_with_channels_right(
    copy: tuple[Path, Path, list[str]], tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    root, meta, spec = copy
    table = next(t for t in find_tables(layout_storage(root)) if "source_4/" in t)
    data = pq.read_table(root / table)
    # The gallery's documented form: URL_<Channel> and nothing else for the images.
    keep = [c for c in data.column_names if not c.startswith(("FileName_Orig", "PathName_Orig"))]
    renamed = [c.replace("URL_Orig", "URL_") for c in keep]
    pq.write_table(data.select(keep).rename_columns(renamed), root / table)
    assert not any(c.startswith("PathName_Orig") for c in pq.read_schema(root / table).names)
    cache = tmp_path / "cache"
    args = ["build-cache", "--kind", "cellpainting", "--source", str(root), "--out", str(cache),
            "--metadata", str(meta), "--map-prefix", spec[0],
            "--select-source", "source_4"]  # fmt: skip
    assert main(args) == 0
    m = mf.load(cache / "manifest.json")
    assert {f.source for f in m.fields} == {"source_4"} and m.rejected == ()
    assert {f.perturbation: f.perturbation_type for f in m.fields} == {
        p: kind for p, (kind, _, _) in PHENOTYPES.items()
    }
    # Channels right: each cached channel is that stain's TIFF, corrected and normalized.
    f = m.fields[0]
    cached = np.asarray(zarr.open_array(str(cache / f.array_path), mode="r")[...])
    for c, (src, ill) in enumerate(zip(f.sources, f.illum, strict=True)):
        assert src.channel == ill.channel == layout.CHANNELS[c]
        raw = decode_tiff((root / src.path).read_bytes(), src.path)
        flat = correct(raw, decode_illum((root / ill.path).read_bytes(), ill.path))
        want = to_uint8(flat[None], (f.normalization[c],))[0]
        assert np.array_equal(cached[c], want), layout.CHANNELS[c]
    # DNA is ch5 on this source's Phenix (channel_mapping.csv), Mito ch1.
    assert f.sources[0].path.endswith("-ch5sk1fk1fl1.tiff")
    assert f.sources[3].path.endswith("-ch1sk1fk1fl1.tiff")


def layout_storage(root: Path) -> Storage:
    return open_storage(str(root))


def test_a_gzipped_csv_table_is_found_and_read(
    copy: tuple[Path, Path, list[str]], tmp_path: Path
) -> None:
    root, _, spec = copy
    for parquet in root.rglob("load_data_with_illum.parquet"):
        csv = parquet.with_suffix(".csv")
        csv.with_suffix(".csv.gz").write_bytes(gzip.compress(csv.read_bytes()))
        parquet.unlink()
        csv.unlink()
    names = find_tables(layout_storage(root))
    assert names and all(n.endswith("load_data_with_illum.csv.gz") for n in names)
    report, built_m = build(str(root), tmp_path / "c", prefixes=_prefixes(spec))
    m = built_m.load()
    assert len(m.fields) == report.fields - 1  # the planted truncated TIFF


def test_urls_and_path_names_that_disagree_are_refused_naming_row_and_column() -> None:
    root = "s3://b/cpg0016-jump"
    row = {"Metadata_Plate": "P", "Metadata_Well": "A01", "Metadata_Site": "1"}
    for c in layout.CHANNELS:
        row |= {
            f"URL_Orig{c}": f"{root}/s/images/B/images/P/{c}.tiff",
            f"PathName_Orig{c}": f"{root}/s/images/B/images/P/",
            f"FileName_Orig{c}": f"{c}.tiff",
        }
    good = layout.parse_load_data([dict(row), dict(row)], "t.parquet", root)
    assert good[0].images[1] == ("AGP", "s/images/B/images/P/AGP.tiff")
    bad = dict(row, FileName_OrigER="Mito.tiff")
    with pytest.raises(
        CellPaintingError,
        match=r"t\.parquet: row 3: column URL_OrigER/PathName_OrigER/FileName_OrigER: "
        r"column URL_OrigER names .*ER\.tiff' but PathName_OrigER\+FileName_OrigER names "
        r".*Mito\.tiff'",
    ):
        layout.parse_load_data([row, bad], "t.parquet", root)
    with pytest.raises(CellPaintingError, match=r"row 2: column Metadata_Well: well 'Z'"):
        layout.parse_load_data([dict(row, Metadata_Well="Z")], "t.parquet", root)


def test_an_unreadable_table_names_its_file() -> None:
    with pytest.raises(CellPaintingError, match=r"x\.csv\.gz: not a readable gzip file"):
        layout.read_table(b"not gzip", "x.csv.gz")
    with pytest.raises(CellPaintingError, match=r"x\.parquet: not a readable parquet table"):
        layout.read_table(b"PAR1 nope", "x.parquet")
    with pytest.raises(CellPaintingError, match=r"prefix map 'nope': expected FROM=TO"):
        layout.PrefixMap.parse(["nope"])


def test_the_longest_matching_prefix_maps_a_url_whatever_the_order_given() -> None:
    # A bucket mapped onto one copy and one of its folders onto another: the folder's files
    # come from the second copy even when the bucket's mapping is given first.
    specs = ["s3://cpg/=/data/all/", "s3://cpg/cpg0016-jump/source_4/=/ssd/source_4/"]
    for order in (specs, specs[::-1]):
        prefixes = layout.PrefixMap.parse(order)
        assert prefixes.apply("s3://cpg/cpg0016-jump/source_4/a.tif") == "/ssd/source_4/a.tif"
        assert prefixes.apply("s3://cpg/cpg0016-jump/source_2/b.tif") == (
            "/data/all/cpg0016-jump/source_2/b.tif"
        )
        assert prefixes.apply("gs://other/c.tif") == "gs://other/c.tif"


def test_an_empty_parquet_cell_reads_as_empty_never_as_the_text_none() -> None:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    table = {"Metadata_Plate": ["P1", None], "FileName_OrigDNA": [None, "a.tif"]}
    pq.write_table(pa.table(table), buffer)
    rows = list(layout.iter_table(buffer.getvalue(), "t.parquet"))
    assert rows == [
        {"Metadata_Plate": "P1", "FileName_OrigDNA": ""},
        {"Metadata_Plate": "", "FileName_OrigDNA": "a.tif"},
    ]


def _rewrite_gz(path: Path, old: str, new: str) -> None:
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()).replace(
        old.encode(), new.encode(), 1)))  # fmt: skip


def test_bad_metadata_stops_before_anything_and_leaves_the_cache_alone(
    copy: tuple[Path, Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, meta, spec = copy
    cache = tmp_path / "cache"
    args = ["build-cache", "--kind", "cellpainting", "--source", str(root), "--out", str(cache),
            "--map-prefix", spec[0], "--metadata", str(meta)]  # fmt: skip
    assert main(args) == 1  # the planted truncated TIFF
    before = {p: p.read_bytes() for p in cache.rglob("*") if p.is_file()}
    # A well whose id no table lists (a typo of DMSO's id).
    _rewrite_gz(meta / TABLES["well"], DMSO, "JCP2022_033925")
    assert main(args) == 2
    err = capsys.readouterr().err.replace("\n", "")
    assert "well.csv.gz: row " in err and "column Metadata_JCP2022: 'JCP2022_033925'" in err
    assert {p: p.read_bytes() for p in cache.rglob("*") if p.is_file()} == before
    _rewrite_gz(meta / TABLES["well"], "JCP2022_033925", DMSO)
    # A control type the release does not have.
    control = meta / TABLES["control"]
    control.write_text(control.read_text().replace("poscon", "positive"))
    assert main(args) == 2
    err = capsys.readouterr().err.replace("\n", "")
    assert "perturbation_control.csv: row 3: column Metadata_pert_type: 'positive'" in err
    assert {p: p.read_bytes() for p in cache.rglob("*") if p.is_file()} == before


def test_fields_the_metadata_does_not_list_are_refused_unless_asked_for_by_name(
    copy: tuple[Path, Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, meta, spec = copy
    well = meta / TABLES["well"]
    rows = gzip.decompress(well.read_bytes()).decode().splitlines(keepends=True)
    # One plate absent from the metadata altogether, and one well of the other plate.
    other = plate_name(1)  # the twin's second plate (CV8000, source_10)
    kept = [r for r in rows if ",BR00117035," not in r and f",{other},A02," not in r]
    well.write_bytes(gzip.compress("".join(kept).encode()))
    cache = tmp_path / "cache"
    args = ["build-cache", "--kind", "cellpainting", "--source", str(root), "--out", str(cache),
            "--map-prefix", spec[0], "--metadata", str(meta)]  # fmt: skip
    assert main(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "7 field(s) of the load-data tables have no perturbation" in err, err
    assert "2021_04_26_Batch1/BR00117035/" in err and "plate BR00117035 (absent from" in err
    assert f"plate {other} well A02 (the plate is listed, this well is not)" in err
    assert "--allow-unlabelled" in err and not cache.exists()  # before any image is read
    assert main([*args, "--select-plate", "BR00117035", "--allow-unlabelled"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "6 field(s) the metadata does not list built with an empty perturbation" in err
    m = mf.load(cache / "manifest.json")
    assert m.header.counts["unlabelled"] == 6 and {f.perturbation for f in m.fields} == {""}


def test_selection_by_source_batch_plate_and_type(
    copy: tuple[Path, Path, list[str]], tmp_path: Path
) -> None:
    root, meta, spec = copy
    prefixes = _prefixes(spec)
    m = build(str(root), tmp_path / "a", metadata=str(meta), prefixes=prefixes,
                 select=Selection(sources=("source_10",)))[1].load()  # fmt: skip
    assert {f.source for f in m.fields} == {"source_10"}
    batch = m.fields[0].batch
    m = build(str(root), tmp_path / "b", prefixes=prefixes, select=Selection(batches=(batch,)))[
        1
    ].load()
    assert {f.batch for f in m.fields} == {batch}
    plate = m.fields[0].plate
    m = build(str(root), tmp_path / "c", prefixes=prefixes, select=Selection(plates=(plate,)))[
        1
    ].load()
    assert {f.plate for f in m.fields} == {plate}
    m = build(str(root), tmp_path / "d", metadata=str(meta), prefixes=prefixes,
                 select=Selection(types=("negcon", "poscon")))[1].load()  # fmt: skip
    assert {f.perturbation_type for f in m.fields} == {"negcon", "poscon"}
    with pytest.raises(CellPaintingError, match="perturbation types needs --metadata"):
        build(str(root), tmp_path / "e", select=Selection(types=("negcon",)))
    with pytest.raises(ConfigError, match="perturbation type\\(s\\) trt"):
        Selection(types=("trt",))
    with pytest.raises(
        CellPaintingError,
        match=r"no load-data table .* for --select-source source_99; the tables list 2 plate",
    ):
        build(str(root), tmp_path / "f", select=Selection(sources=("source_99",)))


def test_the_public_bucket_is_read_anonymously(
    s3_twin: str,
    twin: tuple[Path, TwinInfo],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    s3_server: S3Double,
) -> None:
    # The gallery's bucket policy: anyone may list and read.
    bucket = twin[1].bucket
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": "*",
                "Action": ["s3:GetObject", "s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
            }
        ],
    }
    client = s3_server.client()
    client.put_bucket_policy(Bucket=bucket, Policy=json.dumps(policy))
    # moto applies the policy to GET but not to HEAD (which s3fs sends): public-read ACLs too.
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            client.put_object_acl(Bucket=bucket, Key=obj["Key"], ACL="public-read")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    clear_client_caches()
    args = ["build-cache", "--kind", "cellpainting", "--source", s3_twin,
            "--select-source", "source_4"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "signed")]) == 2  # no keys: refused
    assert main([*args, "--out", str(tmp_path / "anon"), "--anonymous"]) == 0
    assert len(mf.load(tmp_path / "anon" / "manifest.json").fields) > 0
    # The rclone way: an s3 remote with neither keys nor env_auth is read anonymously.
    monkeypatch.setenv("OCTSTAGE_S3_REMOTE", "cpg")
    monkeypatch.setenv("RCLONE_CONFIG_CPG_TYPE", "s3")
    monkeypatch.setenv("RCLONE_CONFIG_CPG_PROVIDER", "AWS")
    monkeypatch.setenv("RCLONE_CONFIG_CPG_ENDPOINT", s3_server.url)
    clear_client_caches()
    assert main([*args, "--out", str(tmp_path / "rclone")]) == 0
    assert mf.load(tmp_path / "rclone" / "manifest.json").fields == (
        mf.load(tmp_path / "anon" / "manifest.json").fields
    )
    clear_client_caches()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 65535), min_size=1, max_size=300),
    st.floats(0, 100, allow_nan=False),
)
def test_histogram_percentiles_equal_numpy_exactly(values: list[int], p: float) -> None:
    field = np.asarray(values, dtype=np.float32)[None, None, :]
    hist = histogram(field)
    assert percentile(hist[0], p) == pytest.approx(float(np.percentile(values, p)), abs=1e-6)


def test_the_read_window_bounds_fields_in_flight() -> None:
    lock = threading.Lock()
    now = peak = 0

    def work(i: int) -> int:
        nonlocal now, peak
        with lock:
            now += 1
            peak = max(peak, now)
        time.sleep(0.002)
        return i

    out = []
    with ThreadPoolExecutor(8) as pool:
        for i in bounded_map(pool, work, range(200), window=3):
            out.append(i)
            with lock:
                now -= 1
    assert out == list(range(200)) and peak <= 3


class ChangingStorage:
    """A local source whose object ``name`` holds other bytes from its second read on (a file
    replaced while the build runs)."""

    def __init__(self, inner: Storage, name: str) -> None:
        self.inner, self.name, self.url, self.reads = inner, name, inner.url, 0

    def read_bytes(self, name: str) -> bytes:
        data = self.inner.read_bytes(name)
        if name == self.name:
            self.reads += 1
            if self.reads > 1:
                return data[:-2] + bytes([data[-2] ^ 1, data[-1]])
        return data

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self.inner.list(prefix)


def test_a_source_that_changes_between_the_passes_is_an_environment_fault(
    copy: tuple[Path, Path, list[str]], tmp_path: Path
) -> None:
    root, _, spec = copy
    inner = open_storage(str(root))
    table = next(t for t in find_tables(inner) if "source_4/" in t)
    rows = layout.parse_load_data(
        layout.read_table((root / table).read_bytes(), table), table, str(root), _prefixes(spec)
    )
    changing = ChangingStorage(inner, rows[0].images[1][1])
    report, built_m = build(changing, tmp_path / "c", load_data=[table], prefixes=_prefixes(spec))  # type: ignore[arg-type]
    m = built_m.load()
    assert report.plates_left_out == [rows[0].plate] and m.fields == ()
    assert [e["source"] for e in report.environment] == [rows[0].item_id]
    assert "changed at the source during the build" in report.environment[0]["reason"]
    assert not report.rejected


def test_a_field_listed_in_two_tables_is_refused_before_any_image_is_read(
    copy: tuple[Path, Path, list[str]], tmp_path: Path
) -> None:
    """The build keeps 8 bytes per field id, not the ids: a repeated id must still be named."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root, _, spec = copy
    a, b = find_tables(layout_storage(root))[:2]
    first = pq.read_table(root / a).slice(3, 1)
    other = pq.read_table(root / b)
    pq.write_table(pa.concat_tables([other, first.cast(other.schema)]), root / b)
    cache = tmp_path / "c"
    with pytest.raises(CellPaintingError, match=r"field source_\d+/\S+/\S+/\d+ is listed twice"):
        build(str(root), cache, load_data=[a, b], prefixes=_prefixes(spec))
    assert not cache.exists()


class _CountingStorage:
    """A storage that counts reads of one object (the rest passes through)."""

    def __init__(self, inner: Storage, name: str) -> None:
        self.inner, self.name, self.reads = inner, name, 0
        self.url = inner.url

    def read_bytes(self, name: str) -> bytes:
        self.reads += name == self.name
        return self.inner.read_bytes(name)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self.inner.list(prefix)

    def stat(self, name: str) -> ObjectInfo:
        return self.inner.stat(name)


def test_a_lab_s_one_table_of_many_plates_is_read_once_to_check_and_once_to_build(
    copy: tuple[Path, Path, list[str]], tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root, _, spec = copy
    a, b = find_tables(layout_storage(root))[:2]
    first, second = pq.read_table(root / a), pq.read_table(root / b)
    one = "lab/all_plates.parquet"
    (root / one).parent.mkdir()
    pq.write_table(pa.concat_tables([first, second.cast(first.schema)]), root / one)
    storage = _CountingStorage(open_storage(str(root)), one)
    report, built = build(storage, tmp_path / "c", load_data=[one], prefixes=_prefixes(spec))  # type: ignore[arg-type]
    assert report.plates == 2 and built.fields == report.fields - len(report.rejected)
    assert {f.plate for f in built.load().fields} == {
        first["Metadata_Plate"][0].as_py(),
        second["Metadata_Plate"][0].as_py(),
    }
    assert storage.reads == 2
