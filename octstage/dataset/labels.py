"""participants.tsv: the label table, and the documented order of the four study groups.

``parse_participants`` is pure: a row that cannot be used (unknown study group or split, an ID
that is not a participant ID, a duplicate) becomes a ``(row reference, reason)`` problem, never a
crash. Only a table that cannot be read at all (no ID or study_group column) raises LabelsError.
IDs stay strings: ``0412`` or ``7111`` are compared as written.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

from octstage.dataset.ids import is_participant_id
from octstage.errors import LabelsError, StorageError
from octstage.storage import open_storage

STUDY_GROUPS: tuple[str, ...] = (
    "healthy",
    "pre_diabetes_lifestyle_controlled",
    "oral_medication_and_or_non_insulin_injectable_medication_controlled",
    "insulin_dependent",
)
SPLITS: tuple[str, ...] = ("train", "val", "test")
ID_COLUMNS: tuple[str, ...] = ("participant_id", "person_id")  # person_id in some exports (v3)
_TRUE, _FALSE = ("true", "1", "yes", "t"), ("false", "0", "no", "f")


@dataclass(frozen=True)
class Participant:
    """One usable row of participants.tsv."""

    participant_id: str
    study_group: str
    label: int  # STUDY_GROUPS.index(study_group)
    split: str  # recommended_split
    clinical_site: str
    retinal_oct: bool | None  # the table's own claim that OCT exists; None when not given


Problem = tuple[str, str]  # (row reference such as "participants.tsv:12", reason)


def parse_participants(text: str, source: str) -> tuple[dict[str, Participant], list[Problem]]:
    """Parse the TSV text; ``source`` names it in problems and errors."""
    reader = csv.DictReader(io.StringIO(text.lstrip("\ufeff")), delimiter="\t")
    columns = [c.strip() for c in reader.fieldnames or []]
    reader.fieldnames = columns
    id_col = next((c for c in ID_COLUMNS if c in columns), None)
    if id_col is None or "study_group" not in columns:
        raise LabelsError(
            f"{source}: needs a participant_id (or person_id) and a study_group column, "
            f"found {columns or 'no header'}"
        )
    participants: dict[str, Participant] = {}
    problems: list[Problem] = []
    for line, row in enumerate(reader, start=2):
        ref = f"{source}:{line}"
        pid = (row.get(id_col) or "").strip()
        group = (row.get("study_group") or "").strip()
        split = (row.get("recommended_split") or "").strip().lower()
        why = None
        if not is_participant_id(pid):
            why = f"not a 4-digit participant id (site 1, 4 or 7): {pid!r}"
        elif pid in participants:
            why = f"duplicate participant {pid} (first row kept)"
        elif group not in STUDY_GROUPS:
            why = f"participant {pid}: unknown study_group {group!r}"
        elif split not in SPLITS:
            why = f"participant {pid}: unknown recommended_split {split!r}"
        if why:
            problems.append((ref, why))
            continue
        flag = (row.get("retinal_oct") or "").strip().lower()
        participants[pid] = Participant(
            participant_id=pid,
            study_group=group,
            label=STUDY_GROUPS.index(group),
            split=split,
            clinical_site=(row.get("clinical_site") or "").strip(),
            retinal_oct=True if flag in _TRUE else False if flag in _FALSE else None,
        )
    return participants, problems


def read_participants(path_or_url: str) -> tuple[dict[str, Participant], list[Problem]]:
    """Read participants.tsv from a local path, ``file://``, ``gs://`` or ``b2://`` URL."""
    root, _, name = str(path_or_url).rstrip("/").rpartition("/")
    scheme_only = root.endswith(":/") or root.endswith(":")
    if not name or scheme_only:
        raise LabelsError(f"{path_or_url}: not a path to participants.tsv")
    try:
        data = open_storage(root or ".").read_bytes(name)
    except StorageError as exc:
        raise LabelsError(f"{path_or_url}: cannot read labels: {exc}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LabelsError(f"{path_or_url}: not UTF-8 text: {exc}") from exc
    return parse_participants(text, source=path_or_url)
