"""A manifest's values held against the schema's types as it loads (``manifest.itemtypes``): a
value of the wrong type, a key missing, unknown or given twice, a column of another Arrow type
or a null where the schema allows none is one line naming the item, the key, the value and what
was expected; nothing is compared first. And the columnar form's ``maxItems`` guard: a list
longer than the schema allows is a suspect row that ``verify`` words."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from octstage import manifest
from octstage.cache.verify import verify
from octstage.errors import ManifestTypeError
from octstage.manifest import itemtypes, rowschema
from octstage.manifest.columnar import ARROW_SCHEMAS
from tests.octstage.test_manifest import make_manifest
from tests.octstage.test_manifest_cellpainting import make_cp_manifest
from tests.octstage.test_manifest_columnar import cp_fields, oct_volumes

Edit = Callable[[dict[str, Any]], None]
DEFS = json.loads(manifest.SCHEMA_PATH.read_text())["$defs"]


def _item(key: str, n: int, change: Callable[[dict[str, Any]], object]) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        change(data[key][n])

    return edit


OCT = "volumes[1] (zarr_path 'volumes/1002/abc.ome.zarr')"
# (edit of the JSON form, what the one line must hold)
JSON_CASES: dict[str, tuple[Edit, tuple[str, ...]]] = {
    "label as text": (
        _item("volumes", 1, lambda v: v.update(label="2")),
        (OCT, "label", "the string '2'", "expected an integer"),
    ),
    "label 1.0": (
        _item("volumes", 1, lambda v: v.update(label=1.0)),
        (OCT, "label", "the number 1.0", "expected an integer"),
    ),
    "split a number": (
        _item("volumes", 1, lambda v: v.update(split=5)),
        (OCT, "split", "the integer 5", "expected a string: one of 'train', 'val', 'test'"),
    ),
    "participant_id a number": (
        _item("volumes", 1, lambda v: v.update(participant_id=1002)),
        (OCT, "participant_id", "the integer 1002", "expected a string"),
    ),
    "zarr_path null": (
        _item("volumes", 1, lambda v: v.update(zarr_path=None)),
        ("volumes[1] (cache_key 'b')", "zarr_path is null", "expected a string"),
    ),
    "split missing": (
        _item("volumes", 1, lambda v: v.pop("split")),
        (OCT, "no key 'split'", "requires it", "one of 'train', 'val', 'test'"),
    ),
    "a key the schema lacks": (
        _item("volumes", 1, lambda v: v.update(splitt="val")),
        (OCT, "unknown key 'splitt'", "'val'"),
    ),
    "a nested value": (
        _item("volumes", 1, lambda v: v["normalization"].update(low="0")),
        (OCT, "normalization.low", "the string '0'", "expected a number"),
    ),
    "a list's element": (
        _item("volumes", 1, lambda v: v["shape"].__setitem__(2, 64.0)),
        (OCT, "shape[2]", "the number 64.0", "expected an integer"),
    ),
    "a clinical value": (
        _item("volumes", 1, lambda v: v["clinical"].update({"3004410": "5.5"})),
        (OCT, "clinical.3004410", "the string '5.5'", "expected a number"),
    ),
    "the header": (
        lambda d: d["header"].update(cache_version="1"),
        ("header.cache_version", "the string '1'", "expected an integer"),
    ),
    "classes": (
        lambda d: d["classes"].append(3),
        ("classes[4]", "the integer 3", "expected a string"),
    ),
}
FIELD = "fields[1] (item_id 'source_0/P1/B02/2')"
CP_CASES: dict[str, tuple[Edit, tuple[str, ...]]] = {
    "label as text": (
        _item("fields", 1, lambda f: f.update(label="1")),
        (FIELD, "label", "the string '1'", "expected an integer or null"),
    ),
    "split a number": (
        _item("fields", 1, lambda f: f.update(split=5)),
        (FIELD, "split", "the integer 5", "one of 'train', 'val', 'test'"),
    ),
    "is_control as text": (
        _item("fields", 1, lambda f: f.update(is_control="no")),
        (FIELD, "is_control", "the string 'no'", "expected true or false"),
    ),
    "a source's size": (
        _item("fields", 1, lambda f: f["sources"][3].update(size="99")),
        (FIELD, "sources[3].size", "the string '99'", "expected an integer"),
    ),
    "channels missing": (
        _item("fields", 1, lambda f: f.pop("channels")),
        (FIELD, "no key 'channels'", "a list of strings"),
    ),
}


def _load(tmp_path: Path, data: dict[str, Any], text: str | None = None) -> ManifestTypeError:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(data, indent=1) if text is None else text)
    with pytest.raises(ManifestTypeError) as info:
        manifest.load(path)
    assert str(info.value).startswith(f"{path}: malformed manifest: ")
    return info.value


@pytest.mark.parametrize(
    ("kind", "case"), [("oct", c) for c in JSON_CASES] + [("cellpainting", c) for c in CP_CASES]
)
def test_a_value_of_the_wrong_type_is_one_line_naming_item_key_and_value(
    tmp_path: Path, kind: str, case: str
) -> None:
    m = make_cp_manifest(cp_fields()) if kind == "cellpainting" else make_manifest(oct_volumes())
    data = manifest.to_dict(m)
    edit, names = (CP_CASES if kind == "cellpainting" else JSON_CASES)[case]
    edit(data)
    error = _load(tmp_path, data)
    (line,) = error.problems
    for name in names:
        assert name in line, (name, line)
    assert line in str(error)


def test_a_key_given_twice_is_named_with_both_values(tmp_path: Path) -> None:
    """``json.loads`` keeps the last of a key given twice: the split that was meant is lost,
    and ``verify`` said OK."""
    text = json.dumps(manifest.to_dict(make_manifest(oct_volumes())), indent=1)
    twice = text.replace('"split": "val"', '"split": "test",\n   "split": "val"', 1)
    assert twice != text
    (line,) = _load(tmp_path, {}, twice).problems
    assert line.startswith(OCT), line
    assert "key 'split' is given 2 times ('test', then 'val')" in line


def test_the_first_few_problems_are_shown_and_the_rest_counted(tmp_path: Path) -> None:
    data = manifest.to_dict(make_manifest(oct_volumes()))
    for volume in data["volumes"]:
        volume.update(label=str(volume["label"]), split=5, site_x=1, participant_id=None)
    error = _load(tmp_path, data)
    assert len(error.problems) == 8
    text = str(error)
    shown = [line for line in text.splitlines() if line.startswith("  volumes[")]
    assert len(shown) == itemtypes.SHOWN and "... and 3 more" in text


@pytest.mark.parametrize("kind", ["oct", "cellpainting"])
def test_clean_manifests_of_either_kind_have_no_problem(kind: str) -> None:
    m = make_cp_manifest(cp_fields()) if kind == "cellpainting" else make_manifest(oct_volumes())
    assert itemtypes.problems(manifest.to_dict(m)) == []


def test_the_item_tables_columns_are_the_schemas_keys_of_its_types() -> None:
    """One source of truth: each column of ``ARROW_SCHEMAS`` is a key of the schema's item, of
    the Arrow type its JSON type reads as, and every key of the item is a column."""
    arrow = {
        "string": pa.types.is_string,
        "integer": pa.types.is_int64,
        "number": pa.types.is_float64,
        "boolean": pa.types.is_boolean,
        "array": pa.types.is_list,
        "object": lambda t: pa.types.is_struct(t) or pa.types.is_map(t),
    }
    for kind, item in (("oct", "volume"), ("cellpainting", "field")):
        properties = DEFS[item]["properties"]
        assert set(ARROW_SCHEMAS[kind].names) == set(properties), kind
        rules = itemtypes._rules()[0].keys["fields" if kind == "cellpainting" else "volumes"]
        assert rules.items is not None
        for column in ARROW_SCHEMAS[kind]:
            types = [t for t in rules.items.keys[column.name].types if t != "null"]
            assert any(arrow[t](column.type) for t in types), (kind, column.name, types)


# ---- the columnar form ---------------------------------------------------------------------


def _table(tmp_path: Path, kind: str) -> tuple[Path, pa.Table]:
    m = make_cp_manifest(cp_fields()) if kind == "cellpainting" else make_manifest(oct_volumes())
    header = tmp_path / "manifest.json"
    manifest.write(m, header, "table")
    return header, pq.read_table(header.with_name("manifest.items.parquet"))


def _replace(header: Path, table: pa.Table) -> None:
    """``table`` in place of the header's, the header's size and hash updated (a hand edit)."""
    path = header.with_name("manifest.items.parquet")
    pq.write_table(table, path)
    data = json.loads(header.read_text())
    data["table"].update(bytes=path.stat().st_size, sha256=manifest.file_sha256(path))
    header.write_text(json.dumps(data))


def _column(table: pa.Table, name: str, change: Callable[[list[Any]], None]) -> pa.Table:
    values = table[name].to_pylist()
    change(values)
    at = table.schema.get_field_index(name)
    return table.set_column(at, name, pa.array(values, table.schema.field(name).type))


def test_a_column_of_another_arrow_type_names_the_column_and_its_type(tmp_path: Path) -> None:
    header, table = _table(tmp_path, "oct")
    at = table.schema.get_field_index("label")
    _replace(header, table.set_column(at, "label", table["label"].cast(pa.string())))
    with pytest.raises(ManifestTypeError) as info:
        manifest.load(header)
    assert info.value.problems == [
        "manifest.items.parquet: column 'label' is string, expected int64"
    ]
    assert "manifest.items.parquet" in str(info.value)


def _nth(n: int, value: Any) -> Callable[[list[Any]], None]:
    return lambda values: values.__setitem__(n, value)


NULLS: dict[str, tuple[str, str, Callable[[list[Any]], None], str]] = {
    "participant_id null": ("oct", "participant_id", _nth(1, None), "participant_id is null"),
    "zarr_path null": ("oct", "zarr_path", _nth(1, None), "row 1: zarr_path is null"),
    "null inside shape": ("oct", "shape", _nth(1, [16, None, 64]), "shape holds a null"),
    "a normalization member null": (
        "oct",
        "normalization",
        _nth(1, {"p_low": 1.0, "p_high": None, "low": 0.0, "high": 1.0}),
        "normalization holds a null",
    ),
    "a clinical value null": ("oct", "clinical", _nth(1, [("3004410", None)]), "clinical holds"),
    "split null": ("cellpainting", "split", _nth(1, None), "split is null"),
    "a source path null": (
        "cellpainting",
        "sources",
        lambda v: v[1][2].update(path=None),
        "sources holds a null",
    ),
}


@pytest.mark.parametrize("case", NULLS)
def test_a_null_where_the_schema_allows_none_names_the_row_and_column(
    tmp_path: Path, case: str
) -> None:
    kind, column, change, words = NULLS[case]
    header, table = _table(tmp_path, kind)
    _replace(header, _column(table, column, change))
    with pytest.raises(ManifestTypeError) as info:
        manifest.load(header)
    (line,) = info.value.problems
    assert line.startswith("manifest.items.parquet row 1") and words in line, line
    if column != "zarr_path" and kind == "oct":
        assert "(zarr_path 'volumes/1002/abc.ome.zarr')" in line, line
    assert f"expected {ARROW_SCHEMAS[kind].field(column).type}" in line


def test_the_nulls_the_schema_allows_load(tmp_path: Path) -> None:
    """An unmeasured intensity, an empty clinical map (OCT), a field without a label, without
    illumination or not packed: nulls and empty lists the schema takes."""
    header, table = _table(tmp_path, "oct")
    table = _column(table, "intensity", _nth(1, None))
    _replace(header, _column(table, "clinical", _nth(1, [])))
    assert manifest.load(header).volumes[1].intensity is None
    header, table = _table(tmp_path, "cellpainting")
    _replace(header, _column(table, "illum", _nth(0, [])))
    loaded = manifest.load(header)
    assert loaded.fields[2].label is None and loaded.fields[0].illum == ()


# ---- the maxItems guard of the column check ------------------------------------------------


def test_a_spacing_of_four_values_is_refused(tmp_path: Path) -> None:
    """``spacing_mm`` holds exactly 3 values (``maxItems``): a 4th passes every Arrow type and
    the consumers' checks, so only the column check's ``maxItems`` makes the row a suspect for
    jsonschema to word; without it ``verify`` says the schema is valid."""
    header, table = _table(tmp_path, "oct")
    table = _column(table, "spacing_mm", _nth(1, [0.12, 0.0039, 0.0113, 1.0]))
    _replace(header, table)
    batch = table.to_batches()[0]
    assert rowschema.suspects(batch, DEFS["volume"], DEFS).tolist() == [False, True]
    report = verify(header)
    assert report.schema == "invalid"
    (error,) = report.schema_errors
    assert error.startswith(
        "table/volumes/1/spacing_mm (zarr_path 'volumes/1002/abc.ome.zarr'): "
    ), error
    assert "is too long" in error, error
