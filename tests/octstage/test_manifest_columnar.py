"""The columnar manifest: a JSON header and a Parquet item table, read like the JSON form."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pyarrow.parquet as pq
import pytest

from octstage import manifest
from octstage.cache.verify import verify
from octstage.errors import ManifestError
from tests.octstage.test_manifest import SCHEMA, make_manifest, make_volume
from tests.octstage.test_manifest_cellpainting import make_cp_manifest, make_field
from tests.octstage.test_verify import make_cache


def cp_fields() -> tuple[manifest.Field, ...]:
    return (
        make_field(),
        make_field(well="B02", site=2),
        manifest.Field(
            **{**make_field("P2", split="val").__dict__, "cache_key": "p2", "label": None}
        ),
    )


def oct_volumes() -> tuple[manifest.Volume, ...]:
    a, b = make_volume(), make_volume("1002", "val", 1)
    intensity = manifest.Intensity((12.5,), (3.25,))
    return a, manifest.Volume(
        **{**b.__dict__, "cache_key": "b", "clinical": {"3004410": 5.5}, "intensity": intensity}
    )


@pytest.mark.parametrize("kind", ["oct", "cellpainting"])
def test_both_forms_load_to_the_same_manifest(tmp_path: Path, kind: str) -> None:
    m = make_cp_manifest(cp_fields()) if kind == "cellpainting" else make_manifest(oct_volumes())
    (tmp_path / "json").mkdir()
    manifest.write(m, tmp_path / "json" / "manifest.json")
    manifest.write(m, tmp_path / "manifest.json", form="table")
    header = json.loads((tmp_path / "manifest.json").read_text())
    jsonschema.validate(header, SCHEMA)
    assert header["schema_version"] == manifest.TABLE_SCHEMA_VERSION
    assert "volumes" not in header and "fields" not in header
    assert header["table"]["path"] == "manifest.items.parquet"
    assert header["table"]["rows"] == len(m.items)
    as_json, as_table = (manifest.load(p / "manifest.json") for p in (tmp_path / "json", tmp_path))
    assert as_json == m and as_table == m
    assert isinstance(as_table.items, manifest.ItemTable)
    assert list(as_table.items) == list(m.items)
    assert as_table.items[-1] == m.items[-1] and as_table.items[1:] == m.items[1:]
    assert manifest.check(as_table) == manifest.check(as_json)
    assert manifest.to_dict(as_table) == manifest.to_dict(m)  # back to JSON, unchanged


def test_split_fields_is_a_view_of_the_table(tmp_path: Path) -> None:
    manifest.write(make_cp_manifest(cp_fields()), tmp_path / "manifest.json", form="table")
    loaded = manifest.load(tmp_path / "manifest.json")
    val = loaded.split_fields("val")
    assert isinstance(val, manifest.ItemTable)
    assert [f.item_id for f in val] == ["source_0/P2/A01/1"]
    assert val.column("plate") == ["P2"] and val[0].label is None
    with pytest.raises(IndexError):
        val[1]


def test_a_trainer_s_common_rows_slice_as_a_list_does(tmp_path: Path) -> None:
    """``CommonRows`` (what a trainer keeps of the table) sliced any way, a reversed one too,
    holds the records the same slice of the items holds."""
    fields = cp_fields()
    manifest.write(make_cp_manifest(fields), tmp_path / "manifest.json", form="table")
    loaded = manifest.load(tmp_path / "manifest.json")
    keys = (slice(None), slice(1, None), slice(None, None, -1), slice(2, 0, -1), slice(-2, None))
    for items, listed in ((loaded.fields, fields), (loaded.split_fields("train"), fields[:2])):
        common = items.common()  # type: ignore[attr-defined]
        assert (common.shapes == [f.shape for f in listed]).all()
        for key in (*keys, slice(1, 2), slice(2, 1), slice(None, 10), slice(5, 9)):
            part = common[key]
            assert [(r.zarr_path, r.shape, r.split, r.label, r.intensity) for r in part] == [
                (f.zarr_path, tuple(f.shape), f.split, f.label, f.intensity) for f in listed[key]
            ]
            assert list(part[::-1][::-1]) == list(part)  # a slice of a slice


def test_the_table_is_written_in_row_groups(tmp_path: Path) -> None:
    fields = tuple(make_field(well=f"B{i:02d}", site=i) for i in range(1, 6))
    rows = manifest.item_rows(make_cp_manifest(fields))
    from octstage.manifest.columnar import write_items

    info = write_items(tmp_path / "t.items.parquet", "cellpainting", rows, rows_per_group=2)
    assert info.rows == 5
    assert pq.ParquetFile(tmp_path / "t.items.parquet").num_row_groups == 3


def test_a_walk_over_every_item_holds_one_row_group(tmp_path: Path) -> None:
    """Iterating the items (``verify``, the schema check of every row) reads the table a row
    group at a time and keeps none of it: the whole table of a million fields is ~1 GB of
    Arrow. A column a trainer kept is sliced, not read again; the rows are the same."""
    from octstage.manifest.columnar import read_items, write_items
    from octstage.manifest.serial import _field_row

    fields = tuple(make_field(well=f"B{i:02d}", site=i) for i in range(1, 6))
    m = make_cp_manifest(fields)
    info = write_items(tmp_path / "t.parquet", "cellpainting", manifest.item_rows(m), 2)
    assert pq.ParquetFile(tmp_path / "t.parquet").num_row_groups == 3
    columns = read_items(tmp_path / "t.parquet", "cellpainting", "t", info.as_dict())
    table = manifest.ItemTable(columns, _field_row)
    seen = []
    for item in table:
        seen.append(item)
        assert not columns.kept and not columns.scratch  # nothing held between row groups
    assert seen == list(fields)
    assert [r["zarr_path"] for r in table.json_rows()] == [f.zarr_path for f in fields]
    columns.get("zarr_path")  # kept, as a trainer keeps it
    assert list(table) == list(fields)


def test_checks_find_the_same_contradictions_in_both_forms(tmp_path: Path) -> None:
    a = make_field()
    twin = manifest.Field(**{**make_field(well="B02").__dict__, "sources": a.sources})
    moved = manifest.Field(**{**make_field("P3", well="C03").__dict__, "zarr_path": a.zarr_path})
    m = make_cp_manifest((a, twin, moved))
    manifest.write(m, tmp_path / "manifest.json", form="table")
    found = manifest.check(manifest.load(tmp_path / "manifest.json"))
    assert found == manifest.check(m)
    assert {f.check for f in found} >= {"duplicate", "shared-source"}


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: d.joinpath("manifest.items.parquet").unlink(), "cannot read"),
        (lambda d: d.joinpath("manifest.items.parquet").write_bytes(b"PAR1"), "bytes, the header"),
        (lambda d: _edit(d, ["table", "rows"], 7), "3 rows, the header says 7"),
        (lambda d: _edit(d, ["table", "path"], "../x.items.parquet"), "not a file name"),
        (lambda d: _edit(d, ["schema_version"], 1), "schema version 1 with an item table"),
    ],
)
def test_a_header_and_table_that_disagree_are_refused(tmp_path: Path, damage, message) -> None:  # type: ignore[no-untyped-def]
    manifest.write(make_cp_manifest(cp_fields()), tmp_path / "manifest.json", form="table")
    damage(tmp_path)
    with pytest.raises(ManifestError, match=message) as info:
        manifest.load(tmp_path / "manifest.json")
    assert str(tmp_path / "manifest.json") in str(info.value)


def _edit(folder: Path, keys: list[str], value: object) -> None:
    path = folder / "manifest.json"
    data = json.loads(path.read_text())
    node = data
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    path.write_text(json.dumps(data))


def test_a_failed_table_write_keeps_the_old_manifest(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    old = make_cp_manifest(cp_fields())
    manifest.write(old, path, form="table")
    bad = manifest.Field(**{**make_field(well="B09").__dict__, "site": "not a number"})
    with pytest.raises(Exception, match="int"):
        manifest.write(make_cp_manifest((bad,)), path, form="table")
    assert manifest.load(path) == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.items.parquet", path.name]


def test_the_schema_refuses_a_header_that_also_lists_items() -> None:
    header = manifest.to_header(make_manifest(oct_volumes()), _info())
    jsonschema.validate(header, SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**header, "volumes": []}, SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**header, "schema_version": 1}, SCHEMA)


def _info() -> manifest.columnar.TableInfo:
    return manifest.columnar.TableInfo("manifest.items.parquet", 2, 10, "0" * 64)


def test_verify_checks_the_table_hash_and_every_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_cache(tmp_path)
    path = tmp_path / "manifest.json"
    manifest.write(manifest.load(path), path, form="table")
    clean = verify(path, progress_seconds=0)
    assert clean.ok and clean.schema == "valid" and clean.verified == 3, clean
    # The rows' schema check is minutes at a million rows: it says how far it is, as the
    # checks of the arrays do (a line per row here: progress every 0 s, no terminal).
    err = capsys.readouterr().err
    assert "schema of each row: 3/3 (100%), 0 problem(s)" in err, err
    assert "verify: 3/3 (100%)" in err
    # A row the JSON Schema refuses (a participant id of the wrong form), hash updated.
    loaded = manifest.load(path)
    rows = list(manifest.item_rows(loaded))
    rows[1]["participant_id"] = "9xyz"
    from octstage.manifest.columnar import write_items

    info = write_items(tmp_path / "manifest.items.parquet", "oct", iter(rows))
    path.write_text(json.dumps(manifest.to_header(loaded, info)))
    report = verify(path)
    assert report.schema == "invalid"
    assert any(e.startswith("table/volumes/1/participant_id") for e in report.schema_errors)
    _edit(tmp_path, ["table", "sha256"], "f" * 64)
    assert any("SHA-256" in e for e in verify(path).schema_errors)


@pytest.mark.parametrize("form", ["json", "table"])
def test_a_folder_cache_streams_its_manifest(
    tmp_path: Path, form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder cache's manifest is written a row at a time into its file, never built as one
    document in memory first (``header_bytes`` is for a bucket: ~2.4 KB a field in RAM)."""
    from octstage.cache.store import CacheStore

    m = make_cp_manifest(cp_fields())

    def whole(*_: object, **__: object) -> bytes:
        raise AssertionError("the whole manifest built in memory")

    monkeypatch.setattr(manifest, "header_bytes", whole)
    CacheStore(str(tmp_path)).write_manifest(m, None, form, lambda: manifest.item_rows(m))
    assert manifest.load(tmp_path / "manifest.json") == m


@pytest.mark.parametrize(
    "change",
    ["label as text", "a column more", "a column less"],
)
def test_an_item_table_of_another_schema_is_refused_naming_its_columns(
    tmp_path: Path, change: str
) -> None:
    """A table of the header's size and row count whose columns or types are not the kind's
    (a table of another tool, or of a newer octstage) is refused, never read as items."""
    import pyarrow as pa

    path = tmp_path / "manifest.json"
    manifest.write(make_manifest(oct_volumes()), path, "table")
    table = pq.read_table(path.with_name("manifest.items.parquet"))
    if change == "label as text":
        at = table.schema.get_field_index("label")
        table = table.set_column(at, "label", table["label"].cast(pa.string()))
    elif change == "a column more":
        table = table.append_column("extra", pa.array(["x"] * table.num_rows))
    else:
        table = table.drop_columns(["checksum"])
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    data = sink.getvalue().to_pybytes()
    info = {"bytes": len(data), "rows": table.num_rows}
    with pytest.raises(ManifestError, match=r"here: item table columns .* differ from a 'oct'"):
        manifest.columnar.read_items(data, "oct", "here", info)


def test_an_undecodable_column_names_the_table(
    tmp_path: Path,
) -> None:
    # The footer whole, one column chunk's compressed bytes overwritten: the load's checks (size,
    # rows, schema) pass and the damage shows when a consumer reads the column.
    manifest.write(make_cp_manifest(cp_fields()), tmp_path / "manifest.json", form="table")
    table = tmp_path / "manifest.items.parquet"
    meta = pq.ParquetFile(table).metadata.row_group(0)
    chunk = max(
        (meta.column(i) for i in range(meta.num_columns)), key=lambda c: c.total_compressed_size
    )
    data = bytearray(table.read_bytes())
    middle = chunk.data_page_offset + chunk.total_compressed_size // 2
    data[middle : middle + 16] = b"\xff" * 16
    table.write_bytes(bytes(data))
    items = manifest.load(tmp_path / "manifest.json").items
    assert isinstance(items, manifest.ItemTable)
    with pytest.raises(
        ManifestError, match=r"manifest.items.parquet: the manifest's item table does not decode"
    ):
        for _ in items.batches():
            pass
