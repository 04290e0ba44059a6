"""The manifest's second kind: Cell Painting fields round trip, validate, and old OCT manifests
still load (no ``kind`` key means OCT)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest

from octstage import manifest
from octstage.errors import ManifestError
from tests.octstage.test_manifest import make_manifest, make_volume

SCHEMA = json.loads(manifest.SCHEMA_PATH.read_text())


def make_field(
    plate: str = "P1", well: str = "A01", site: int = 1, split: str = "train"
) -> manifest.Field:
    channels = manifest.CELLPAINTING_CHANNELS
    control = well == "A01"
    return manifest.Field(
        item_id=f"source_0/{plate}/{well}/{site}",
        split=split,
        label=0 if control else 1,
        zarr_path=f"fields/{plate}/k{well}{site}.ome.zarr",
        shape=(5, 64, 64),
        dtype="uint8",
        checksum="sha256:" + "1" * 64,
        cache_key=f"k{well}{site}",
        sources=tuple(
            manifest.ChannelSource(c, f"images/B1/images/{plate}/{well}-{c}.tiff", "b" * 40, 99)
            for c in channels
        ),
        source="source_0",
        batch="B1",
        plate=plate,
        well=well,
        site=site,
        channels=channels,
        perturbation="DMSO" if control else "JCP2022_000001",
        perturbation_type="negcon" if control else "compound",
        is_control=control,
        normalization=tuple(manifest.Normalization(1.0, 99.8, 100.0, 4000.0) for _ in channels),
        illum=tuple(
            manifest.ChannelSource(c, f"illum/{plate}/{plate}_Illum{c}.npy", "c" * 40, 7)
            for c in channels
        ),
    )


def make_cp_manifest(fields: tuple[manifest.Field, ...]) -> manifest.Manifest:
    header = manifest.Header(
        dataset="twin",
        created="2026-11-23T00:00:00Z",
        code_version="0.1.0",
        cache_version=manifest.CACHE_VERSION,
        config_hash="h",
        config={"size": 64},
        counts=manifest.count_summary(fields, rejected=0),
    )
    return manifest.Manifest(
        header, ("DMSO", "JCP2022_000001"), (), (), kind="cellpainting", fields=fields
    )


def test_cellpainting_round_trip_and_schema(tmp_path: Path) -> None:
    fields = (make_field(), make_field(well="B02", site=2), make_field("P2", split="val"))
    m = make_cp_manifest(fields)
    path = tmp_path / "manifest.json"
    manifest.write(m, path)
    data = json.loads(path.read_text())
    jsonschema.validate(data, SCHEMA)
    assert data["kind"] == "cellpainting"
    loaded = manifest.load(path)
    assert loaded == m
    assert loaded.items == fields
    assert [f.plate for f in loaded.split_fields("val")] == ["P2"]
    assert loaded.fields[0].array_path == "fields/P1/kA011.ome.zarr/0"
    counts = loaded.header.counts
    assert counts["fields"] == 3 and counts["plates"] == 2 and counts["controls"] == 2
    assert counts["by_perturbation_type"] == {"negcon": 2, "compound": 1}


def test_field_label_may_be_none() -> None:
    f = make_field()
    unlabelled = manifest.Field(**{**f.__dict__, "label": None, "perturbation_type": ""})
    data = manifest.to_dict(make_cp_manifest((unlabelled,)))
    jsonschema.validate(data, SCHEMA)
    assert manifest.from_dict(data).fields[0].label is None


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["fields"][0].update(zarr_path="volumes/1001/x.ome.zarr"),
        lambda d: d["fields"][0].update(perturbation_type="drug"),
        lambda d: d["fields"][0]["sources"][0].update(sha1="nope"),
        lambda d: d["fields"][0].pop("plate"),
        lambda d: d.pop("fields"),  # a cellpainting manifest must list fields
        lambda d: d["volumes"].append(
            manifest.to_dict(make_manifest((make_volume(),)))["volumes"][0]
        ),
    ],
)
def test_schema_rejects_bad_cellpainting_manifests(edit) -> None:  # type: ignore[no-untyped-def]
    data = manifest.to_dict(make_cp_manifest((make_field(),)))
    jsonschema.validate(data, SCHEMA)
    edit(data)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, SCHEMA)


def test_an_oct_manifest_may_not_list_fields() -> None:
    data = manifest.to_dict(make_manifest((make_volume(),)))
    data["fields"] = []
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, SCHEMA)


def test_an_old_oct_manifest_without_kind_loads_and_validates(tmp_path: Path) -> None:
    m = make_manifest((make_volume("1001"),))
    data = manifest.to_dict(m)
    assert data["kind"] == "oct"
    old = copy.deepcopy(data)
    del old["kind"]  # written before the second kind existed
    jsonschema.validate(old, SCHEMA)
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(old))
    loaded = manifest.load(path)
    assert loaded == m and loaded.kind == "oct" and loaded.items == m.volumes


def test_an_unknown_kind_is_refused_with_the_file_named(tmp_path: Path) -> None:
    data = manifest.to_dict(make_manifest((make_volume(),)))
    data["kind"] = "histology"
    path = tmp_path / "m.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="kind 'histology'") as info:
        manifest.load(path)
    assert str(path) in str(info.value)


def test_a_malformed_field_names_the_manifest(tmp_path: Path) -> None:
    data = manifest.to_dict(make_cp_manifest((make_field(),)))
    del data["fields"][0]["channels"]
    path = tmp_path / "m.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="malformed manifest") as info:
        manifest.load(path)
    assert str(path) in str(info.value)
