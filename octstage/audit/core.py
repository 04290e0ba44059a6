"""``octstage audit-ids``: which labelled participants have verified OCT, and why the others don't.

``audit`` is pure: labels plus one ``FileRecord`` per listed file (its header, or why it could
not be read) in, an ``AuditReport`` out. ``scan`` does the I/O through the Storage protocol
(local folder or bucket): it lists ``retinal_oct/structural_oct/`` and reads each DICOM header
only (stop before pixels), in threads because remote reads are latency-bound.

A file counts for a participant only when folder, file-name prefix and PatientID agree
(``ids.resolve``), its header describes a usable volume (``DicomHeader.problem``) and, when the
release's ``retinal_oct/manifest.tsv`` is given, its row there agrees too (``witness``): files
the table lists that are not there, and files there that it does not list, are reported. A file
that is excluded is still *attributed* to every labelled participant that any of its three ID
sources names, so a participant whose scans sit in ``7049_old/`` is reported as "files
excluded: folder_not_id", not as "no OCT".
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from octstage.dataset.dicom import DicomHeader, read_header
from octstage.dataset.ids import DEVICES, Reason, is_participant_id, parse_oct_path, resolve
from octstage.dataset.labels import SPLITS, STUDY_GROUPS, Participant, Problem
from octstage.dataset.release import TsvRow
from octstage.dataset.witness import check_row
from octstage.errors import DicomError, OctstageError, StorageError
from octstage.storage import ObjectInfo, Storage

OCT_PREFIX = "retinal_oct/structural_oct/"
# A header with per-frame functional groups is tens of KB; one request of this size reads it
# without pulling megabytes of pixel data per file from a bucket.
HEADER_CHUNK = 256 * 1024
UNREADABLE = "unreadable"
_HEADER_ID_KINDS = {
    Reason.PATIENT_ID_MISSING,
    Reason.PATIENT_ID_NOT_ID,
    Reason.PATIENT_ID_DISAGREES,
}
# Participant-level reasons for a labelled participant without verified OCT.
NO_OCT_EXPECTED = "participants.tsv: retinal_oct FALSE"
NO_OCT_FOUND = "no OCT file names this participant"


@dataclass(frozen=True)
class FileRecord:
    """One listed object: its header, or the reason it could not be read (None: not read)."""

    name: str  # relative to the dataset root
    size: int
    header: DicomHeader | None = None
    error: str | None = None


@dataclass(frozen=True)
class FileOutcome:
    """The verdict on one file."""

    name: str
    participant_id: str | None  # set only when verified and usable
    claimed: tuple[str, ...]  # every valid ID its folder, file name or PatientID gives
    device: str | None
    kind: str | None = None  # exclusion category (ids.Reason, HeaderProblem, "unreadable", tsv_*)
    reason: str | None = None  # human-readable, names the values
    region: str | None = None  # anatomic_region from manifest.tsv; None when it has no row


@dataclass(frozen=True)
class Tally:
    """Labelled participants, those with verified OCT, and the share."""

    labelled: int
    with_oct: int

    @property
    def overlap(self) -> float:
        return self.with_oct / self.labelled if self.labelled else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"labelled": self.labelled, "with_oct": self.with_oct, "overlap": self.overlap}


@dataclass(frozen=True)
class Missing:
    """A labelled participant without verified OCT, and why."""

    participant_id: str
    split: str
    study_group: str
    reason: str  # NO_OCT_EXPECTED, NO_OCT_FOUND or "files excluded: <main kind>"
    files: tuple[str, ...] = ()  # excluded files attributed to them


@dataclass(frozen=True)
class AuditReport:
    """Everything ``audit-ids`` reports (``audit.report.to_json`` is its JSON form)."""

    total: Tally
    expected: Tally  # only participants whose retinal_oct flag is not FALSE
    by_split: dict[str, Tally]
    by_study_group: dict[str, Tally]
    by_device: dict[str, Tally]  # labelled participants with any file on the device
    files: tuple[FileOutcome, ...]
    labelled_without_oct: tuple[Missing, ...]
    oct_without_label: tuple[str, ...]  # verified participants absent from participants.tsv
    label_problems: tuple[Problem, ...] = ()
    flags: tuple[str, ...] = field(default=())  # splits / classes with no verified participant
    tsv_rows: int | None = None  # rows of retinal_oct/manifest.tsv; None: there is none
    tsv_missing: tuple[str, ...] = ()  # files manifest.tsv lists that are not there
    tsv_unlisted: tuple[str, ...] = ()  # .dcm files there that manifest.tsv does not list

    @property
    def excluded(self) -> tuple[FileOutcome, ...]:
        return tuple(f for f in self.files if f.kind is not None)

    @property
    def conflicts(self) -> tuple[FileOutcome, ...]:
        """Files whose ID sources disagree or are malformed (not layout or header damage)."""
        ids = {r.value for r in Reason} - {Reason.NOT_IN_LAYOUT, Reason.UNKNOWN_DEVICE}
        return tuple(f for f in self.files if f.kind in ids)

    def file_reasons(self) -> Counter[str]:
        return Counter(f.kind for f in self.files if f.kind is not None)

    def missing_reasons(self) -> Counter[str]:
        return Counter(m.reason for m in self.labelled_without_oct)


def judge(record: FileRecord, row: TsvRow | None = None) -> FileOutcome:
    """Verify one file: path layout, readable header, agreeing IDs, usable volume, and its
    manifest.tsv ``row`` when there is one (in that order)."""
    header = record.header
    res = resolve(record.name, header.patient_id if header else None)
    path = parse_oct_path(record.name)
    claimed = tuple(
        dict.fromkeys(
            v
            for v in (
                path.folder_id if path else None,
                path.file_id if path else None,
                (header.patient_id or "").strip() if header else None,
                row.participant_id if row else None,
            )
            if v and is_participant_id(v)
        )
    )
    region = row.anatomic_region if row else None
    out = FileOutcome(record.name, None, claimed, path.device if path else None, region=region)
    if res.kind is not None and res.kind not in _HEADER_ID_KINDS:
        return _exclude(out, res.kind.value, res.reason)
    if header is None:
        return _exclude(out, UNREADABLE, record.error or "header not read")
    if res.kind is not None:
        return _exclude(out, res.kind.value, res.reason)
    problem = header.problem()
    if problem is not None:
        return _exclude(out, problem[0].value, problem[1])
    assert path is not None and res.participant_id is not None  # resolve() accepted both
    disagreement = None
    if row is not None:
        disagreement = check_row(
            row,
            device=path.device,
            participant_id=res.participant_id,
            laterality=header.laterality or path.laterality,
            shape=header.shape,
            header_model=header.model,
        )
    if disagreement is not None:
        return _exclude(out, *disagreement)
    return FileOutcome(record.name, res.participant_id, claimed, out.device, region=region)


def audit(
    participants: Mapping[str, Participant],
    records: Iterable[FileRecord],
    label_problems: Sequence[Problem] = (),
    tsv: Mapping[str, TsvRow] | None = None,
) -> AuditReport:
    """The overlap between labels and verified OCT, and a reason for every gap; ``tsv`` is the
    release's manifest.tsv by path (``release.parse_manifest_tsv``), None when there is none."""
    rows = tsv or {}
    files = tuple(judge(r, rows.get(r.name)) for r in sorted(records, key=lambda r: r.name))
    names = {f.name for f in files}
    verified: dict[str, set[str]] = defaultdict(set)  # participant -> devices
    seen_on: dict[str, set[str]] = defaultdict(set)  # device -> claimed participants
    attributed: dict[str, list[FileOutcome]] = defaultdict(list)
    for f in files:
        if f.participant_id:
            verified[f.participant_id].add(f.device or "?")
        for pid in f.claimed:
            seen_on[f.device or "?"].add(pid)
            if f.kind is not None:
                attributed[pid].append(f)
    with_oct = {p for p in participants if p in verified}
    missing = tuple(
        _missing(p, attributed.get(pid, []))
        for pid, p in sorted(participants.items())
        if pid not in with_oct
    )

    def tally(pids: Iterable[str]) -> Tally:
        ids = set(pids)
        return Tally(len(ids), len(ids & with_oct))

    by_split = {s: tally(p for p, v in participants.items() if v.split == s) for s in SPLITS}
    by_group = {
        g: tally(p for p, v in participants.items() if v.study_group == g) for g in STUDY_GROUPS
    }
    devices = [*DEVICES, *sorted(set(seen_on) - set(DEVICES))]
    by_device = {
        d: Tally(
            len(seen_on[d] & set(participants)),
            sum(1 for p in with_oct if d in verified[p]),
        )
        for d in devices
        if d in seen_on or d in DEVICES
    }
    return AuditReport(
        total=tally(participants),
        expected=tally(p for p, v in participants.items() if v.retinal_oct is not False),
        by_split=by_split,
        by_study_group=by_group,
        by_device=by_device,
        files=files,
        labelled_without_oct=missing,
        oct_without_label=tuple(sorted(set(verified) - set(participants))),
        label_problems=tuple(label_problems),
        flags=_flags(participants, with_oct),
        tsv_rows=None if tsv is None else len(tsv),
        tsv_missing=tuple(sorted(set(rows) - names)),
        tsv_unlisted=tuple(
            sorted(n for n in names if tsv is not None and n not in rows and parse_oct_path(n))
        ),
    )


def _missing(p: Participant, excluded: list[FileOutcome]) -> Missing:
    if excluded:
        main = Counter(f.kind for f in excluded).most_common(1)[0][0]
        reason = f"files excluded: {main}"
    else:
        reason = NO_OCT_EXPECTED if p.retinal_oct is False else NO_OCT_FOUND
    return Missing(
        p.participant_id, p.split, p.study_group, reason, tuple(f.name for f in excluded)
    )


def _flags(participants: Mapping[str, Participant], with_oct: set[str]) -> tuple[str, ...]:
    """Splits, classes and split x class cells that are labelled but have no verified OCT."""
    cells: dict[tuple[str, str], int] = Counter()
    labelled: dict[tuple[str, str], int] = Counter()
    for pid, p in participants.items():
        for key in ((p.split, ""), ("", p.study_group), (p.split, p.study_group)):
            labelled[key] += 1
            cells[key] += pid in with_oct
    flags = []
    for (split, group), n in sorted(labelled.items()):
        if n and not cells[(split, group)]:
            where = " / ".join(x for x in (split and f"split {split}", group) if x)
            flags.append(f"{where}: {n} labelled, none with verified OCT")
    return tuple(flags)


def _exclude(out: FileOutcome, kind: str, reason: str | None) -> FileOutcome:
    return FileOutcome(out.name, None, out.claimed, out.device, kind, reason or kind, out.region)


def list_oct(storage: Storage) -> list[ObjectInfo]:
    """Every object under the OCT tree; refuses an empty one (a wrong --oct root, most likely)."""
    objects = list(storage.list(OCT_PREFIX))
    if not objects:
        raise OctstageError(
            f"{storage.url}: no files under {OCT_PREFIX}; --oct must be the dataset root "
            "(the folder holding retinal_oct/)"
        )
    return objects


def read_headers(
    storage: Storage,
    objects: Sequence[ObjectInfo],
    workers: int = 16,
    done: Callable[[], None] | None = None,
) -> list[FileRecord]:
    """One FileRecord per object: .dcm headers read in threads (remote reads wait on latency).

    Objects outside the layout are not read. ``done()`` is called after each object.
    """

    def read(obj: ObjectInfo) -> FileRecord:
        try:
            if obj.problem is not None:
                return FileRecord(obj.name, obj.size, error=obj.problem)
            if parse_oct_path(obj.name) is None:
                return FileRecord(obj.name, obj.size)
            with storage.open(obj.name, chunk_size=HEADER_CHUNK) as fh:
                return FileRecord(obj.name, obj.size, header=read_header(fh, obj.name))
        except (DicomError, StorageError) as exc:
            # The outcome already names the file: keep only the reason.
            return FileRecord(obj.name, obj.size, error=str(exc).removeprefix(f"{obj.name}: "))
        finally:
            if done:
                done()

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        try:
            return list(pool.map(read, objects))
        except KeyboardInterrupt:
            pool.shutdown(wait=False, cancel_futures=True)  # drop the headers not yet read
            raise
