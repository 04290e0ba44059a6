"""participants.tsv: the label table, and the documented order of the four study groups.

``parse_label_table`` is pure: a row that cannot be used (unknown study group or split, an ID
that is not a participant ID, a participant listed twice with different labels) becomes a
``(row reference, reason)`` problem naming the column and the value, never a crash. A table
that cannot give a single label (no ID, study_group or recommended_split column, no row at all)
raises LabelsError.
IDs stay strings: ``0412`` or ``7111`` are compared as written.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

from octstage.dataset.ids import is_participant_id
from octstage.errors import LabelsError, StorageError
from octstage.storage import open_storage, split_url

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


@dataclass(frozen=True)
class LabelTable:
    """participants.tsv as read: the usable rows, every problem row, and the participants left
    out because their rows contradict each other (participant ID -> the reason, naming rows)."""

    participants: dict[str, Participant]
    problems: list[Problem]
    excluded: dict[str, str]


def parse_participants(text: str, source: str) -> tuple[dict[str, Participant], list[Problem]]:
    """Parse the TSV text; ``source`` names it in problems and errors."""
    table = parse_label_table(text, source)
    return table.participants, table.problems


def parse_label_table(text: str, source: str) -> LabelTable:
    """Parse the TSV text into a LabelTable; ``source`` names it in problems and errors.

    Each problem names the row, the column, the value and the reason. A participant listed
    twice with the same study group and split is kept (a warning row); one listed with
    different ones is left out altogether, with a reason naming both rows: keeping either row
    would be a guess about which label is true. A table that lacks a needed column or has no
    row at all is refused (LabelsError): it would otherwise give an empty build.
    """
    reader = csv.DictReader(io.StringIO(text.lstrip("\ufeff")), delimiter="\t")
    columns = [c.strip() for c in reader.fieldnames or []]
    reader.fieldnames = columns
    id_col = next((c for c in ID_COLUMNS if c in columns), None)
    if id_col is None or "study_group" not in columns:
        raise LabelsError(
            f"{source}: needs a participant_id (or person_id) and a study_group column, "
            f"found {columns or 'no header'}"
        )
    if "recommended_split" not in columns:
        raise LabelsError(
            f"{source}: no recommended_split column (found {columns}): every participant "
            "needs a split (train, val or test)"
        )
    participants: dict[str, Participant] = {}
    first_row: dict[str, int] = {}
    problems: list[Problem] = []
    excluded: dict[str, str] = {}
    rows = 0
    for line, row in enumerate(reader, start=2):
        rows += 1
        ref = f"{source}:{line}"
        pid = (row.get(id_col) or "").strip()
        group = (row.get("study_group") or "").strip()
        split = (row.get("recommended_split") or "").strip().lower()
        why = None
        if not is_participant_id(pid):
            why = f"column {id_col}: {pid!r} is not a 4-digit participant id (site 1, 4 or 7)"
        elif group not in STUDY_GROUPS:
            why = (
                f"participant {pid}: column study_group: unknown value {group!r} "
                f"(known: {', '.join(STUDY_GROUPS)})"
            )
        elif split not in SPLITS:
            why = (
                f"participant {pid}: column recommended_split: unknown value {split!r} "
                f"(known: {', '.join(SPLITS)})"
            )
        if why:
            problems.append((ref, why))
            continue
        if pid in excluded:
            problems.append((ref, f"participant {pid}: listed again; left out: {excluded[pid]}"))
            continue
        if pid in participants:
            first = participants[pid]
            where = f"{source}:{first_row[pid]}"
            if (first.study_group, first.split) == (group, split):
                problems.append(
                    (ref, f"warning: participant {pid} listed again, same as row {where}: kept")
                )
                continue
            reason = (
                f"participant {pid} listed twice with different labels: row {where} says "
                f"{first.study_group}/{first.split}, row {ref} says {group}/{split}"
            )
            del participants[pid]
            excluded[pid] = reason
            problems.append((ref, f"{reason}: participant left out"))
            continue
        flag = (row.get("retinal_oct") or "").strip().lower()
        first_row[pid] = line
        participants[pid] = Participant(
            participant_id=pid,
            study_group=group,
            label=STUDY_GROUPS.index(group),
            split=split,
            clinical_site=(row.get("clinical_site") or "").strip(),
            retinal_oct=True if flag in _TRUE else False if flag in _FALSE else None,
        )
    if rows == 0:
        raise LabelsError(f"{source}: header only, no participant rows")
    return LabelTable(participants, problems, excluded)


def read_participants(path_or_url: str) -> tuple[dict[str, Participant], list[Problem]]:
    """Read participants.tsv from a local path, ``file://``, ``gs://`` or ``b2://`` URL."""
    table = read_label_table(path_or_url)
    return table.participants, table.problems


def read_label_table(path_or_url: str) -> LabelTable:
    """Read participants.tsv (a local path or URL) into a LabelTable."""
    root, name = split_url(str(path_or_url))
    scheme_only = root.endswith(":/") or root.endswith(":")
    if not name or scheme_only:
        raise LabelsError(f"{path_or_url}: not a path to participants.tsv")
    try:
        data = open_storage(root).read_bytes(name)
    except StorageError as exc:
        raise LabelsError(f"{path_or_url}: cannot read labels: {exc}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LabelsError(f"{path_or_url}: not UTF-8 text: {exc}") from exc
    return parse_label_table(text, source=path_or_url)
