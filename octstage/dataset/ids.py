"""Participant-ID resolution for one OCT file: folder, file name and DICOM PatientID must agree.

Pure functions over a file's relative path and its ``PatientID`` (no I/O). Each source is one
whole token checked with ``fullmatch``, never a search inside free text. That is what the earlier
trainer's ``\\b(1[0-9]{3})\\b`` got wrong three ways: it only took IDs starting with 1 (one site
of three), ``\\b`` never splits ``1001_spectralis...`` (``_`` is a word character), and it picked
4-digit segments out of dotted SOP Instance UIDs (``.1651.``), inventing IDs.

Layout (any prefix before ``structural_oct`` is allowed, e.g. ``retinal_oct/`` or a bucket prefix):
``structural_oct/<device>/<folder>/<pid>_<protocol...>_<l|r>_<SOPInstanceUID>.dcm``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

# The four devices of AI-READI's structural_oct/ folders.
DEVICES: tuple[str, ...] = (
    "heidelberg_spectralis",
    "topcon_maestro2",
    "topcon_triton",
    "zeiss_cirrus",
)

# A participant ID is four digits whose first digit is the clinical site. Always a string.
SITES: dict[str, str] = {"1": "UW", "4": "UCSD", "7": "UAB"}
_PID = re.compile(r"[147][0-9]{3}")


class Reason(StrEnum):
    """Kinds of resolution failure (``Resolution.kind``), stable names for counting."""

    NOT_IN_LAYOUT = "not_in_layout"
    UNKNOWN_DEVICE = "unknown_device"
    FOLDER_NOT_ID = "folder_not_id"
    FILENAME_NOT_ID = "filename_not_id"
    FOLDER_FILENAME_DISAGREE = "folder_filename_disagree"
    PATIENT_ID_MISSING = "patient_id_missing"
    PATIENT_ID_NOT_ID = "patient_id_not_id"
    PATIENT_ID_DISAGREES = "patient_id_disagrees"


def is_participant_id(value: str) -> bool:
    """True for a 4-digit string whose first digit is a known site (1, 4 or 7)."""
    return _PID.fullmatch(value) is not None


def site_of(participant_id: str) -> str | None:
    """The clinical site (``UW``, ``UCSD``, ``UAB``) of an ID, None for an unknown first digit."""
    return SITES.get(participant_id[:1]) if len(participant_id) == 4 else None


@dataclass(frozen=True)
class OctPath:
    """What a file's path says. ``file_id`` is the file name's first ``_`` token, as written."""

    device: str
    folder_id: str
    file_id: str | None
    protocol: str | None  # e.g. "spectralis_ppol_mac_hr_oct"
    laterality: str | None  # "L" / "R" from the file name
    uid: str | None  # the SOP Instance UID at the end of the file name


def parse_oct_path(relpath: str) -> OctPath | None:
    """Split ``.../structural_oct/<device>/<folder>/<file>.dcm``; None for any other path."""
    parts = relpath.split("/")
    if (
        len(parts) < 4
        or parts[-4] != "structural_oct"
        or not parts[-1].lower().endswith(".dcm")
        or not all(parts[-3:])
    ):
        return None
    device, folder, fname = parts[-3], parts[-2], parts[-1]
    tokens = fname[: -len(".dcm")].split("_")
    # <pid>_<protocol...>_<l|r>_<uid>: the UID has dots but no underscore, so it is the last token.
    lat_ok = len(tokens) >= 4 and tokens[-2].lower() in ("l", "r")
    return OctPath(
        device=device,
        folder_id=folder,
        file_id=tokens[0] if len(tokens) > 1 else None,
        protocol="_".join(tokens[1:-2]) if lat_ok else None,
        laterality=tokens[-2].upper() if lat_ok else None,
        uid=tokens[-1] if lat_ok else None,
    )


@dataclass(frozen=True)
class Resolution:
    """``participant_id`` is set only when folder, file-name prefix and PatientID all agree."""

    participant_id: str | None
    reason: str | None  # human-readable, names the disagreeing values
    kind: Reason | None = None  # the same, as a stable category


def resolve(relpath: str, patient_id: str | None) -> Resolution:
    """Verify one file's participant ID from its path and its header's raw ``PatientID``.

    A path outside the layout resolves to nothing with a reason; surrounding blanks in the
    header value are dropped (DICOM pads strings), anything else must match exactly.
    """
    path = parse_oct_path(relpath)
    if path is None:
        return _no(Reason.NOT_IN_LAYOUT, "not a .dcm under structural_oct/<device>/<folder>/")
    if path.device not in DEVICES:
        return _no(Reason.UNKNOWN_DEVICE, f"unknown device folder {path.device!r}")
    if not is_participant_id(path.folder_id):
        return _no(Reason.FOLDER_NOT_ID, f"folder: {_not_id(path.folder_id)}")
    if path.file_id is None or not is_participant_id(path.file_id):
        return _no(Reason.FILENAME_NOT_ID, f"file-name prefix: {_not_id(path.file_id or '')}")
    if path.file_id != path.folder_id:
        return _no(
            Reason.FOLDER_FILENAME_DISAGREE,
            f"folder {path.folder_id!r} != file prefix {path.file_id!r}",
        )
    header = (patient_id or "").strip()
    if not header:
        return _no(Reason.PATIENT_ID_MISSING, "PatientID missing")
    if not is_participant_id(header):
        return _no(Reason.PATIENT_ID_NOT_ID, f"PatientID: {_not_id(header)}")
    if header != path.folder_id:
        return _no(
            Reason.PATIENT_ID_DISAGREES, f"PatientID {header!r} != folder {path.folder_id!r}"
        )
    return Resolution(header, None)


def _no(kind: Reason, reason: str) -> Resolution:
    return Resolution(None, reason, kind)


def _not_id(value: str) -> str:
    return f"not a 4-digit participant id (site 1, 4 or 7): {value!r}"
