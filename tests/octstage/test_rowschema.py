"""The schema's item rules on typed columns (``rowschema``): every row jsonschema refuses is a
suspect, clean rows are not, and ``verify`` names a damaged row of an item table by its item."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pyarrow as pa
import pytest

from octstage import manifest
from octstage.cache.verify import verify
from octstage.manifest import rowschema
from octstage.manifest.columnar import ARROW_SCHEMAS, json_row, write_items
from tests.octstage.test_manifest import make_manifest
from tests.octstage.test_manifest_cellpainting import make_cp_manifest
from tests.octstage.test_manifest_columnar import cp_fields, oct_volumes

DEFS = json.loads(manifest.SCHEMA_PATH.read_text())["$defs"]
Damage = Callable[[dict[str, Any]], None]


def _set(key: str, value: object) -> Damage:
    return lambda row: row.__setitem__(key, value)


def _inner(key: str, n: int, member: str, value: object) -> Damage:
    return lambda row: row[key][n].__setitem__(member, value)


CP: dict[str, Damage] = {
    "item_id empty": _set("item_id", ""),
    "split": _set("split", "dev"),
    "label negative": _set("label", -2),
    "zarr_path": _set("zarr_path", "fields/P1/k.zarr"),
    "shape size 0": _set("shape", [5, 0, 64]),
    "shape of 2": _set("shape", [5, 64]),
    "dtype": _set("dtype", "uint16"),
    "checksum": _set("checksum", "sha256:xyz"),
    "checksum null": _set("checksum", None),
    "sources empty": _set("sources", []),
    "source sha1": _inner("sources", 2, "sha1", "not-hex"),
    "source size": _inner("sources", 0, "size", -1),
    "source path null": _inner("sources", 4, "path", None),
    "illum sha1": _inner("illum", 1, "sha1", "C" * 40),
    "illum null": _set("illum", None),
    "plate empty": _set("plate", ""),
    "well": _set("well", "Z9"),
    "site": _set("site", -1),
    "channels repeated": _set("channels", ["DNA", "AGP", "DNA", "Mito", "RNA"]),
    "channels empty": _set("channels", []),
    "perturbation_type": _set("perturbation_type", "drug"),
    "is_control null": _set("is_control", None),
    "normalization empty": _set("normalization", []),
    "normalization member null": _inner("normalization", 3, "high", None),
    "intensity mean": _set("intensity", {"mean": [300.0], "std": [1.0]}),
    "intensity std": _set("intensity", {"mean": [3.0], "std": [-1.0]}),
    "intensity empty": _set("intensity", {"mean": [], "std": [1.0]}),
    "pack_index negative": lambda r: r.update(zarr_path="packs/P1/a.pack.zarr", pack_index=-1),
    "pack without index": _set("zarr_path", "packs/P1/a.pack.zarr"),
    "index without pack": _set("pack_index", 3),
}
OCT: dict[str, Damage] = {
    "participant_id": _set("participant_id", "9xyz"),
    "device": _set("device", "nikon"),
    "laterality": _set("laterality", "X"),
    "label null": _set("label", None),
    "source_sha1": _set("source_sha1", "abc"),
    "source_size": _set("source_size", -1),
    "spacing zero": _set("spacing_mm", [0.0, 1.0, 1.0]),
    "spacing of 2": _set("spacing_mm", [1.0, 1.0]),
    "normalization member null": lambda r: r["normalization"].__setitem__("low", None),
    "clinical value null": _set("clinical", [("3004410", None)]),
    "zarr_path": _set("zarr_path", "fields/1001/a.ome.zarr"),
    "source_shape": _set("source_shape", [0, 1, 1]),
}


def _rows(kind: str) -> list[dict[str, Any]]:
    m = make_cp_manifest(cp_fields()) if kind == "cellpainting" else make_manifest(oct_volumes())
    rows = list(manifest.item_rows(m))
    if kind == "oct":
        rows.append(dict(rows[0], zarr_path="volumes/1001/c.ome.zarr"))
    return rows


@pytest.mark.parametrize(
    ("kind", "damage"),
    [("cellpainting", d) for d in CP] + [("oct", d) for d in OCT],
)
def test_every_row_the_schema_refuses_is_a_suspect_and_no_clean_row_is(
    kind: str, damage: str
) -> None:
    rows = _rows(kind)
    (CP if kind == "cellpainting" else OCT)[damage](rows[1])
    batch = pa.RecordBatch.from_pylist(rows, schema=ARROW_SCHEMAS[kind])
    item = "field" if kind == "cellpainting" else "volume"
    validator = jsonschema.Draft202012Validator({"$defs": DEFS, "$ref": f"#/$defs/{item}"})
    refused = [bool(list(validator.iter_errors(json_row(r)))) for r in batch.to_pylist()]
    assert refused == [False, True, False], refused  # the damage is one the schema refuses
    assert rowschema.suspects(batch, DEFS[item], DEFS).tolist() == refused
    # A slice of a batch (a row group's later batches) reads its own rows' lists.
    assert rowschema.suspects(batch.slice(1), DEFS[item], DEFS).tolist() == [True, False]


def test_a_keyword_the_column_check_does_not_know_is_refused() -> None:
    batch = pa.RecordBatch.from_pylist([{"a": "x"}])
    with pytest.raises(ValueError, match="'format'"):
        rowschema.suspects(batch, {"properties": {"a": {"format": "date"}}}, {})


def test_verify_names_a_damaged_row_of_an_item_table_by_its_item(tmp_path: Path) -> None:
    """A bad value in one typed column (a well of the wrong form) is found on the columns and
    worded by jsonschema: its row, its column and its item."""
    m = make_cp_manifest(cp_fields())
    rows = list(manifest.item_rows(m))
    rows[1]["well"] = "Z9"
    info = write_items(tmp_path / "manifest.items.parquet", "cellpainting", iter(rows))
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest.to_header(m, info)))
    report = verify(path)
    assert report.schema == "invalid"
    (error,) = report.schema_errors
    assert error.startswith(f"table/fields/1/well (item_id {m.fields[1].item_id!r}): 'Z9'"), error
