"""build-cache and the release's own tables: manifest.tsv (regions, --from-tsv, a disagreeing row)
and clinical_data/ (--concept: values per participant, missing codes dropped and counted)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest

from octstage import manifest as mf
from octstage.cli import main
from octstage.dataset.clinical import parse_concepts
from octstage.dataset.release import TSV_NAME, split_region
from octstage.dataset.synth import SynthInfo, generate
from octstage.errors import ReleaseError
from tests.octstage.build_helpers import CONFIG, build

HBA1C = 3004410


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> SynthInfo:
    return generate(tmp_path_factory.mktemp("rel") / "aireadi", participants=20, seed=5)


@pytest.fixture(scope="module")
def built(small: SynthInfo, tmp_path_factory: pytest.TempPathFactory) -> mf.Manifest:
    cache = tmp_path_factory.mktemp("relcache") / "cache"
    code, _ = build(small.root, cache, CONFIG, concepts=(HBA1C,))
    assert code == 1
    return mf.load(cache / "manifest.json")


def test_every_volume_records_model_region_scan_size_and_hba1c(
    small: SynthInfo, built: mf.Manifest
) -> None:
    models = {"heidelberg_spectralis": "Spectralis", "topcon_maestro2": "Maestro2",
              "topcon_triton": "Triton", "zeiss_cirrus": "Cirrus"}  # fmt: skip
    for v in built.volumes:
        assert v.device_model == models[v.device]
        assert (v.anatomic_region, v.scan_size) == split_region(small.regions[v.source_path])
        hba1c = small.hba1c.get(v.participant_id)
        assert v.clinical == ({} if hba1c is None else {str(HBA1C): hba1c})
    assert {v.scan_size for v in built.volumes} >= {"", "12 x 12"}
    (concept,) = built.concepts
    assert (concept.concept_id, concept.name, concept.unit) == (HBA1C, "hba1c", "%")
    assert concept.participants == len(small.hba1c)
    assert sum(concept.missing.values()) == len(small.labelled) - len(small.hba1c) >= 1
    assert set(concept.missing) <= {"555", "777", "888", "999"}
    schema = json.loads(mf.SCHEMA_PATH.read_text())
    jsonschema.validate(mf.to_dict(built), schema)
    counts = built.header.counts["by_region"]
    assert sum(counts.values()) == len(built.volumes) and "Macula, 12 x 12" in counts


def test_a_manifest_from_before_the_release_fields_still_loads(built: mf.Manifest) -> None:
    data = mf.to_dict(built)
    data.pop("concepts")
    for v in data["volumes"]:
        for key in ("device_model", "anatomic_region", "scan_size", "clinical"):
            v.pop(key)
    old = mf.from_dict(data)
    assert old.concepts == () and old.volumes[0].anatomic_region == ""
    assert old.volumes[0].clinical == {}
    jsonschema.validate(data, json.loads(mf.SCHEMA_PATH.read_text()))


def test_from_tsv_builds_what_the_table_lists(
    small: SynthInfo, built: mf.Manifest, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    shutil.copytree(small.root, src)
    table = src / TSV_NAME
    lines = table.read_text().splitlines()
    gone = next(f for f in small.files if f not in small.excluded and f not in small.unlisted)
    (src / gone).unlink()
    # a row naming the other eye of a good file: the build must reject that file
    flip = next(f for f in small.files if f not in small.excluded and f not in small.unlisted
                and f != gone and "_r_" in f)  # fmt: skip
    n = next(i for i, line in enumerate(lines) if f"/{flip}\t" in line)
    cells = lines[n].split("\t")
    cells[5] = "L"
    lines[n] = "\t".join(cells)
    table.write_text("\n".join(lines) + "\n")
    code, summary = build(src, tmp_path / "cache", CONFIG, from_tsv=True)
    assert code == 1
    got = mf.load(tmp_path / "cache" / "manifest.json")
    reasons = {r.source: r.reason for r in got.rejected}
    assert reasons[gone].startswith(f"{TSV_NAME}: line ") and "no such file" in reasons[gone]
    assert reasons[flip].startswith(f"{TSV_NAME}: ") and "says eye 'L'" in reasons[flip]
    assert not set(small.unlisted) & (set(reasons) | {v.source_path for v in got.volumes})
    assert {v.source_path for v in got.volumes} == {v.source_path for v in built.volumes} - {
        gone,
        flip,
    }
    assert summary["rejected_by_reason"]["retinal_oct/manifest.tsv"] == 2


def test_bad_clinical_input_is_a_clear_error(
    small: SynthInfo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["build-cache", "--source", str(small.root), "--labels",
            str(small.root / "participants.tsv"), "--out", str(tmp_path / "c")]  # fmt: skip
    assert main([*args, "--concept", "123"]) == 2
    err = "".join(capsys.readouterr().err.split())
    assert "conceptid(s)123innoneofmeasurement.csv" in err and "Traceback" not in err
    assert not (tmp_path / "c" / "manifest.json").exists()
    text = (small.root / "clinical_data" / "measurement.csv").read_text()
    with pytest.raises(ReleaseError, match=r"measurement\.csv:2: value_as_number 'n/a'"):
        lines = text.splitlines()
        cells = lines[1].split(",")  # the first participant's HbA1c
        cells[5] = "n/a"
        lines[1] = ",".join(cells)
        parse_concepts({"measurement": "\n".join(lines)}, [HBA1C], "x")
    with pytest.raises(ReleaseError, match=r"missing column\(s\) value_as_number"):
        parse_concepts({"measurement": text.replace("value_as_number", "value")}, [HBA1C], "x")
