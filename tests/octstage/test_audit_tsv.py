"""The release's retinal_oct/manifest.tsv as the audit's fourth witness, and its bad input."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from octstage.audit.core import AuditReport, FileRecord, audit, list_oct, read_headers
from octstage.cli import main
from octstage.dataset.labels import read_participants
from octstage.dataset.release import TSV_NAME, TsvRow, parse_manifest_tsv, read_manifest_tsv
from octstage.dataset.synth import SynthInfo
from octstage.dataset.witness import check_row
from octstage.errors import ReleaseError
from octstage.storage import LocalStorage


@pytest.fixture(scope="module")
def records(synth_info: SynthInfo) -> list[FileRecord]:
    storage = LocalStorage(synth_info.root)
    return read_headers(storage, list_oct(storage), workers=4)


@pytest.fixture
def tsv(synth_info: SynthInfo) -> dict[str, TsvRow]:
    rows = read_manifest_tsv(LocalStorage(synth_info.root))
    assert rows is not None
    return rows


def _audit(info: SynthInfo, records: list[FileRecord], tsv: dict[str, TsvRow]) -> AuditReport:
    participants, problems = read_participants(str(info.root / "participants.tsv"))
    return audit(participants, records, problems, tsv)


def _good_file(info: SynthInfo, nth: int = 0) -> str:
    """The nth file the audit accepts whose participant has another accepted file."""
    ok = [f for f in info.files if f not in info.excluded and f not in info.unlisted]
    return [f for f in ok if sum(g.split("/")[3] == f.split("/")[3] for g in ok) >= 2][nth]


def test_the_twin_agrees_with_its_own_manifest_tsv(
    synth_info: SynthInfo, records: list[FileRecord], tsv: dict[str, TsvRow]
) -> None:
    report = _audit(synth_info, records, tsv)
    assert {f.name: f.kind for f in report.excluded} == synth_info.excluded
    assert report.tsv_rows == len(synth_info.files) - len(synth_info.unlisted)
    assert report.tsv_missing == ()
    assert report.tsv_unlisted == tuple(sorted(synth_info.unlisted))
    regions = {f: r for f, r in synth_info.regions.items() if f not in synth_info.unlisted}
    assert {f.name: f.region for f in report.files if f.region} == regions
    participants, problems = read_participants(str(synth_info.root / "participants.tsv"))
    without = audit(participants, records, problems)
    assert without.tsv_rows is None and without.tsv_unlisted == ()
    assert {f.name for f in without.excluded} == set(synth_info.excluded)


def test_a_row_naming_the_other_eye_excludes_the_file(
    synth_info: SynthInfo, records: list[FileRecord], tsv: dict[str, TsvRow]
) -> None:
    name = _good_file(synth_info)
    row = tsv[name]
    tsv[name] = dataclasses.replace(row, laterality="L" if row.laterality == "R" else "R")
    report = _audit(synth_info, records, tsv)
    (bad,) = [f for f in report.excluded if f.name not in synth_info.excluded]
    assert (bad.name, bad.kind) == (name, "tsv_laterality_disagrees")
    assert f"manifest.tsv:{row.line}" in (bad.reason or "")


def test_a_header_naming_no_eye_is_witnessed_by_its_file_name(
    synth_info: SynthInfo, records: list[FileRecord], tsv: dict[str, TsvRow]
) -> None:
    # The header names no eye: the file name's eye is the one the row must agree with, and a
    # row naming the other eye still excludes the file (the witness is not skipped).
    name = _good_file(synth_info)
    no_eye = _with_header(records, name, laterality=None)
    assert not [f for f in _audit(synth_info, no_eye, tsv).excluded if f.name == name]
    row = tsv[name]
    tsv[name] = dataclasses.replace(row, laterality="L" if row.laterality == "R" else "R")
    (bad,) = [f for f in _audit(synth_info, no_eye, tsv).excluded if f.name == name]
    assert bad.kind == "tsv_laterality_disagrees" and f"manifest.tsv:{row.line}" in (
        bad.reason or ""
    )
    verdict = check_row(
        tsv[name], device=name.split("/")[2], participant_id=row.participant_id,
        laterality=None, shape=row.shape,
    )  # fmt: skip
    assert verdict is not None and verdict[0] == "tsv_laterality_disagrees"


def test_a_row_naming_another_participant_excludes_and_attributes(
    synth_info: SynthInfo, records: list[FileRecord], tsv: dict[str, TsvRow]
) -> None:
    name = _good_file(synth_info, 3)
    other = next(p for p in synth_info.labelled if p != tsv[name].participant_id)
    tsv[name] = dataclasses.replace(tsv[name], participant_id=other)
    report = _audit(synth_info, records, tsv)
    (bad,) = [f for f in report.excluded if f.name not in synth_info.excluded]
    assert (bad.name, bad.kind) == (name, "tsv_participant_disagrees")
    assert other in bad.claimed and repr(other) in (bad.reason or "")


def test_other_disagreements_device_region_shape(
    synth_info: SynthInfo, records: list[FileRecord], tsv: dict[str, TsvRow]
) -> None:
    names = [_good_file(synth_info, n) for n in (0, 2, 4)]
    row = tsv[names[0]]
    other_model = "Cirrus" if row.model != "Cirrus" else "Triton"
    tsv[names[0]] = dataclasses.replace(row, model=other_model)
    tsv[names[1]] = dataclasses.replace(tsv[names[1]], anatomic_region="Temporal Periphery")
    tsv[names[2]] = dataclasses.replace(tsv[names[2]], frames=tsv[names[2]].frames + 1)
    report = _audit(synth_info, records, tsv)
    kinds = {f.name: f.kind for f in report.excluded if f.name not in synth_info.excluded}
    assert kinds == {
        names[0]: "tsv_device_disagrees",
        names[1]: "tsv_region_unknown",
        names[2]: "tsv_shape_disagrees",
    }


def test_a_missing_file_and_an_unlisted_file_are_reported(
    synth_info: SynthInfo, records: list[FileRecord], tsv: dict[str, TsvRow]
) -> None:
    gone = _good_file(synth_info, 1)
    dropped = _good_file(synth_info, 5)
    del tsv[dropped]
    report = _audit(synth_info, [r for r in records if r.name != gone], tsv)
    assert report.tsv_missing == (gone,)
    assert dropped in report.tsv_unlisted
    assert set(report.tsv_unlisted) == {dropped, *synth_info.unlisted}


def test_cli_reports_the_witness_in_json(synth_info: SynthInfo, tmp_path: Path) -> None:
    root = tmp_path / "ds"
    shutil.copytree(synth_info.root, root)
    table = root / TSV_NAME
    lines = table.read_text().splitlines()
    name = _good_file(synth_info)
    n = next(i for i, line in enumerate(lines) if f"/{name}\t" in line)
    cells = lines[n].split("\t")
    cells[5] = "L" if cells[5] == "R" else "R"  # laterality
    lines[n] = "\t".join(cells)
    lines.append(lines[1].replace(".dcm", "-gone.dcm"))  # a row for a file that is not there
    table.write_text("\n".join(lines) + "\n")
    out = tmp_path / "audit.json"
    args = ["audit-ids", "--labels", str(root / "participants.tsv"), "--oct", str(root)]
    assert main([*args, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["manifest_tsv"]["missing"] == [lines[-1].split("\t")[12].lstrip("/")]
    assert sorted(data["manifest_tsv"]["unlisted"]) == sorted(synth_info.unlisted)
    assert data["file_reasons"]["tsv_laterality_disagrees"] == 1


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace("anatomic_region\t", "region\t", 1), "missing column(s) anatomic"),
        (
            lambda t: t.replace("\t62\t96\t8\t", "\t62\t96\teight\t", 1),
            ":2: number_of_frames 'eight'",
        ),
        (lambda t: t + t.splitlines()[1] + "\n", "listed twice (first on line 2)"),
        (lambda t: t.replace("\tOCT\t", "\tOCT\textra\t", 1), ":2: more cells than the header"),
    ],
)
def test_a_malformed_manifest_tsv_is_a_clear_error(
    synth_info: SynthInfo,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    edit: object,
    message: str,
) -> None:
    text = (synth_info.root / TSV_NAME).read_text()
    bad = edit(text)  # type: ignore[operator]
    with pytest.raises(ReleaseError, match=r"manifest\.tsv"):
        parse_manifest_tsv(bad, "x/retinal_oct/manifest.tsv")
    root = tmp_path / "ds"
    shutil.copytree(synth_info.root, root)
    (root / TSV_NAME).write_text(bad)
    args = ["audit-ids", "--labels", str(root / "participants.tsv"), "--oct", str(root)]
    assert main(args) == 2
    err = capsys.readouterr().err
    flat = "".join(err.split())  # rich wraps lines to the terminal's width
    assert "manifest.tsv" in flat and "".join(message.split()) in flat and "Traceback" not in err


def test_the_audit_reports_a_training_selection(synth_info: SynthInfo, tmp_path: Path) -> None:
    """--select-*: the counts of the volumes data.select would keep (device by model or folder,
    region by name), the same files build-cache would put in the manifest."""
    out = tmp_path / "audit.json"
    root = synth_info.root
    args = ["audit-ids", "--labels", str(root / "participants.tsv"), "--oct", str(root)]
    select = ["--select-device", "Cirrus", "--select-region", "Macula", "--select-eye", "R"]
    assert main([*args, *select, "--json", str(out)]) == 0
    sel = json.loads(out.read_text())["selection"]
    keep = [
        f for f in synth_info.files
        if f not in synth_info.excluded and f not in synth_info.unlisted
        and "/zeiss_cirrus/" in f and synth_info.regions[f].startswith("Macula") and "_r_" in f
    ]  # fmt: skip
    assert keep and sel["volumes"] == len(keep)
    assert sel["with_oct"] == len({f.split("/")[3] for f in keep})
    assert (sel["device"], sel["region"], sel["eye"]) == (["Cirrus"], ["Macula"], ["R"])
    assert sum(t["with_oct"] for t in sel["by_split"].values()) == sel["with_oct"]


def test_a_selected_value_no_file_has_is_refused_naming_what_exists(
    synth_info: SynthInfo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo in --select-region would select nothing and report zeros: refused (exit 2)."""
    root = synth_info.root
    out = tmp_path / "audit.json"
    args = ["audit-ids", "--labels", str(root / "participants.tsv"), "--oct", str(root)]
    assert main([*args, "--select-region", "Maculla", "--json", str(out)]) == 2
    err = "".join(capsys.readouterr().err.split())  # rich wraps lines to the terminal's width
    assert "--select-region:'Maculla'matchesnofile" in err and "'Macula'" in err
    assert "Traceback" not in err and not out.exists()


def _with_header(records: list[FileRecord], name: str, **changes: Any) -> list[FileRecord]:
    """The records with file ``name``'s header changed (``model=...``, ``laterality=None``)."""
    out = []
    for r in records:
        if r.name == name:
            assert r.header is not None
            r = dataclasses.replace(r, header=dataclasses.replace(r.header, **changes))
        out.append(r)
    return out


def test_a_header_model_other_than_the_folder_and_row_excludes_the_file(
    synth_info: SynthInfo, records: list[FileRecord], tsv: dict[str, TsvRow]
) -> None:
    # Row and folder agree; only the header names another device: the header's check alone
    # sees it (the test above trips the folder's check first).
    name = _good_file(synth_info)
    other = "Cirrus HD-OCT 5000" if tsv[name].model != "Cirrus" else "Spectralis"
    report = _audit(synth_info, _with_header(records, name, model=other), tsv)
    (bad,) = [f for f in report.excluded if f.name not in synth_info.excluded]
    assert (bad.name, bad.kind) == (name, "tsv_device_disagrees")
    assert f"the header says {other!r}" in (bad.reason or "")


def test_a_row_and_header_naming_another_device_than_the_folder_exclude_the_file(
    synth_info: SynthInfo, records: list[FileRecord], tsv: dict[str, TsvRow]
) -> None:
    # Header and row agree on a model of another folder: the folder's check alone sees it, as
    # for build-cache, which has no header model to compare.
    name = _good_file(synth_info)
    other = "Cirrus" if tsv[name].model != "Cirrus" else "Triton"
    tsv[name] = dataclasses.replace(tsv[name], model=other)
    report = _audit(synth_info, _with_header(records, name, model=other), tsv)
    (bad,) = [f for f in report.excluded if f.name not in synth_info.excluded]
    assert (bad.name, bad.kind) == (name, "tsv_device_disagrees")
    assert "the file lies under" in (bad.reason or "")
    verdict = check_row(
        tsv[name], device=name.split("/")[2], participant_id=tsv[name].participant_id,
        laterality=tsv[name].laterality, shape=tsv[name].shape,
    )  # fmt: skip
    assert verdict is not None and verdict[0] == "tsv_device_disagrees"
