"""Participant-ID resolution: folder, file-name prefix and PatientID must agree (the incident)."""

from __future__ import annotations

import re

import pytest

from octstage.dataset.ids import Reason, is_participant_id, parse_oct_path, resolve, site_of

UID = "1.2.826.0.1.3680043.8.498.1651.7.42"  # carries a 4-digit, site-1-looking segment
LEGACY = re.compile(r"\b(1[0-9]{3})\b")  # the earlier trainer's regex, for contrast only


def oct_path(folder: str, fname: str, device: str = "topcon_maestro2") -> str:
    return f"retinal_oct/structural_oct/{device}/{folder}/{fname}"


@pytest.mark.parametrize(
    ("pid", "device", "protocol"),
    [
        ("1001", "heidelberg_spectralis", "spectralis_ppol_mac_hr_oct"),
        ("4150", "topcon_maestro2", "maestro2_3d_macula_oct"),
        ("7111", "zeiss_cirrus", "cirrus_mac_oct_oct"),
    ],
)
def test_ids_from_all_three_sites_resolve(pid: str, device: str, protocol: str) -> None:
    rel = oct_path(pid, f"{pid}_{protocol}_l_{UID}.dcm", device)
    res = resolve(rel, pid)
    assert (res.participant_id, res.reason, res.kind) == (pid, None, None)
    path = parse_oct_path(rel)
    assert path is not None
    assert (path.device, path.folder_id, path.file_id) == (device, pid, pid)
    assert (path.protocol, path.laterality, path.uid) == (protocol, "L", UID)


def test_the_incident_regex_fails_where_resolve_does_not() -> None:
    rel = oct_path("4150", f"4150_maestro2_3d_macula_oct_l_{UID}.dcm")
    # What went wrong before: site 4 is invisible, "_" hides the prefix, the UID invents 1651.
    assert LEGACY.findall(rel.split("/")[-1]) == ["1651"]
    assert resolve(rel, "4150").participant_id == "4150"
    assert "1651" not in str(parse_oct_path(rel)).replace(UID, "")


def test_uid_segments_never_become_ids() -> None:
    # No ID prefix: a 4-digit segment in the UID must not stand in for one.
    res = resolve(oct_path("1651", f"scan_export_l_{UID}.dcm"), "1651")
    assert res.participant_id is None
    assert res.kind is Reason.FILENAME_NOT_ID


@pytest.mark.parametrize(
    ("rel", "patient_id", "kind", "says"),
    [
        (oct_path("1001", f"1002_maestro2_oct_r_{UID}.dcm"), "1002",
         Reason.FOLDER_FILENAME_DISAGREE, "folder '1001' != file prefix '1002'"),
        (oct_path("1001", f"1001_maestro2_oct_r_{UID}.dcm"), "4150", Reason.PATIENT_ID_DISAGREES,
         "PatientID '4150' != folder '1001'"),
        (oct_path("1001", f"1001_maestro2_oct_r_{UID}.dcm"), None, Reason.PATIENT_ID_MISSING,
         "PatientID missing"),
        (oct_path("1001", f"1001_maestro2_oct_r_{UID}.dcm"), "  ", Reason.PATIENT_ID_MISSING,
         "PatientID missing"),
        (oct_path("1001", f"1001_maestro2_oct_r_{UID}.dcm"), "AIREADI-1001",
         Reason.PATIENT_ID_NOT_ID, "'AIREADI-1001'"),
        (oct_path("1001", f"1001_maestro2_oct_r_{UID}.dcm"), "01001", Reason.PATIENT_ID_NOT_ID,
         "'01001'"),
        (oct_path("1001_old", f"1001_maestro2_oct_r_{UID}.dcm"), "1001", Reason.FOLDER_NOT_ID,
         "'1001_old'"),
        (oct_path("abc", f"abc_maestro2_oct_r_{UID}.dcm"), "1001", Reason.FOLDER_NOT_ID, "'abc'"),
        (oct_path("2001", f"2001_maestro2_oct_r_{UID}.dcm"), "2001", Reason.FOLDER_NOT_ID,
         "site 1, 4 or 7"),
        (oct_path("1001", f"1001_oct_r_{UID}.dcm", device="canon_xephilio"), "1001",
         Reason.UNKNOWN_DEVICE, "unknown device folder 'canon_xephilio'"),
        ("retinal_oct/structural_oct/topcon_maestro2/1001/extra/1001_x_r_1.2.dcm", "1001",
         Reason.NOT_IN_LAYOUT, "structural_oct/<device>/<folder>/"),
        (oct_path("1001", "1001_maestro2_oct_r_1.2.json"), "1001", Reason.NOT_IN_LAYOUT, ".dcm"),
    ],
)  # fmt: skip
def test_each_disagreement_gets_its_reason(
    rel: str, patient_id: str | None, kind: Reason, says: str
) -> None:
    res = resolve(rel, patient_id)
    assert res.participant_id is None
    assert res.kind is kind
    assert res.reason is not None and says in res.reason


def test_dicom_padding_is_dropped_but_nothing_else() -> None:
    rel = oct_path("7111", f"7111_maestro2_oct_r_{UID}.dcm")
    assert resolve(rel, "7111 ").participant_id == "7111"
    assert resolve(rel, "7111\t").participant_id == "7111"
    assert resolve(rel, "711").participant_id is None


def test_any_prefix_before_structural_oct_is_fine() -> None:
    fname = f"4150_maestro2_oct_l_{UID}.dcm"
    for prefix in ("", "mirror/v3/", "retinal_oct/"):
        rel = f"{prefix}structural_oct/topcon_maestro2/4150/{fname}"
        assert resolve(rel, "4150").participant_id == "4150"


def test_ids_are_strings_with_a_site_digit() -> None:
    values = ("1001", "4999", "7000", "0412", "2001", "100", "10010")
    assert [is_participant_id(v) for v in values] == [True] * 3 + [False] * 4
    assert (site_of("1001"), site_of("4150"), site_of("7111"), site_of("2001")) == (
        "UW",
        "UCSD",
        "UAB",
        None,
    )


def test_a_file_name_without_laterality_still_parses() -> None:
    path = parse_oct_path(oct_path("1001", "1001_export.dcm"))
    assert path is not None
    assert (path.file_id, path.laterality, path.uid, path.protocol) == ("1001", None, None, None)
