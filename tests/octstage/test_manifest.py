"""The manifest contract: round trip, JSON Schema, version checks, atomic writes."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from octstage import manifest
from octstage.dataset.labels import STUDY_GROUPS
from octstage.errors import ManifestError

SCHEMA = json.loads((Path(__file__).parents[2] / "octstage" / "manifest.schema.json").read_text())


def make_volume(pid: str = "1001", split: str = "train", label: int = 0) -> manifest.Volume:
    return manifest.Volume(
        participant_id=pid,
        device="heidelberg_spectralis",
        laterality="R",
        protocol="spectralis_ppol_mac_hr_oct",
        split=split,
        study_group=STUDY_GROUPS[label],
        label=label,
        source_path=f"retinal_oct/structural_oct/heidelberg_spectralis/{pid}/{pid}_x_r_1.2.3.dcm",
        source_sha1="a" * 40,
        source_size=1234,
        transfer_syntax="1.2.840.10008.1.2.1",
        source_shape=(61, 496, 768),
        spacing_mm=(0.12, 0.0039, 0.0113),
        zarr_path=f"volumes/{pid}/abc.ome.zarr",
        shape=(16, 64, 64),
        dtype="uint8",
        normalization=manifest.Normalization(1.0, 99.0, 10.0, 200.0),
        checksum="sha256:" + "0" * 64,
        cache_key="abc",
    )


def make_manifest(volumes: tuple[manifest.Volume, ...]) -> manifest.Manifest:
    header = manifest.Header(
        dataset="test",
        created="2026-11-21T00:00:00Z",
        code_version="0.1.0",
        cache_version=manifest.CACHE_VERSION,
        config_hash="h",
        config={"shape": [16, 64, 64]},
        counts=manifest.count_summary(volumes, rejected=1),
    )
    rejected = (manifest.Rejected("retinal_oct/bad.dcm", "empty file"),)
    return manifest.Manifest(header, STUDY_GROUPS, volumes, rejected)


def test_round_trip_and_schema(tmp_path: Path) -> None:
    m = make_manifest((make_volume("1001"), make_volume("4150", "val", 2)))
    path = tmp_path / "manifest.json"
    manifest.write(m, path)
    jsonschema.validate(json.loads(path.read_text()), SCHEMA)
    loaded = manifest.load(path)
    assert loaded == m
    assert [v.participant_id for v in loaded.split("val")] == ["4150"]
    assert loaded.volumes[0].array_path == "volumes/1001/abc.ome.zarr/0"
    assert loaded.header.counts["by_split"] == {"train": 1, "val": 1}


def test_schema_rejects_a_bad_participant_id() -> None:
    data = manifest.to_dict(make_manifest((make_volume("1651"),)))
    jsonschema.validate(data, SCHEMA)
    data["volumes"][0]["participant_id"] = "2001"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, SCHEMA)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(schema_version=99), "schema version 99"),
        (lambda d: d["header"].update(cache_version=99), "cache version 99"),
        (lambda d: d["volumes"][0].pop("checksum"), "malformed manifest"),
    ],
)
def test_load_refuses_other_versions_and_missing_fields(tmp_path: Path, edit, message) -> None:  # type: ignore[no-untyped-def]
    data = manifest.to_dict(make_manifest((make_volume(),)))
    edit(data)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=message) as info:
        manifest.load(path)
    assert str(path) in str(info.value)


def test_load_names_the_file_when_it_is_not_json(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text('{"schema_version": 1, "hea')
    with pytest.raises(ManifestError, match="not valid JSON") as info:
        manifest.load(path)
    assert str(path) in str(info.value)


def test_failed_write_keeps_the_old_manifest_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    good = make_manifest((make_volume(),))
    manifest.write(good, path)
    bad = make_manifest((make_volume(),))
    bad.header.config["unserializable"] = object()  # json.dumps fails half way through
    with pytest.raises(TypeError):
        manifest.write(bad, path)
    assert manifest.load(path) == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]


@pytest.mark.parametrize("kind", ["oct", "cellpainting", "empty"])
def test_a_streamed_json_manifest_is_the_one_document_written_at_once(
    tmp_path: Path, kind: str
) -> None:
    """``write(..., rows=...)`` writes the items as they come: the file must be the very text of
    ``json.dumps(to_dict(m), indent=1)`` that the whole manifest gives."""
    from tests.octstage.test_manifest_cellpainting import make_cp_manifest, make_field

    if kind == "cellpainting":
        m = make_cp_manifest((make_field(), make_field(well="B02"), make_field(site=2)))
    else:
        m = make_manifest(() if kind == "empty" else (make_volume(), make_volume("1002")))
    streamed = tmp_path / "streamed.json"
    rows = list(manifest.item_rows(m))
    manifest.write(m, streamed, rows=lambda: iter(rows))
    whole = json.dumps(manifest.to_dict(m), indent=1) + "\n"
    assert streamed.read_text() == whole
    assert manifest.load(streamed) == m
