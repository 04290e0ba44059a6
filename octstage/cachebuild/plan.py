"""The pure half of ``build-cache``: cache keys, what to do with each source file, records,
manifest entries and the summary. No I/O here (beyond looking up installed package versions
for the cache key); ``octstage.cachebuild.run`` and ``octstage.cachebuild.task`` do the reading
and writing.

A file's fate is decided in the cheapest order: its path (layout, folder vs file-name ID), its
label, the source inventory (size, SHA1), and only then its bytes (header, PatientID, pixels).
Every rejection reason reads ``"<category>: <detail>"``; the category is what the summary
counts.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from octstage.cachebuild import normalize
from octstage.config import BuildConfig
from octstage.dataset import dicom
from octstage.dataset.ids import Reason, parse_oct_path, resolve
from octstage.dataset.labels import Participant
from octstage.dataset.release import DEVICE_MODELS, TSV_NAME, TsvRow, split_region
from octstage.dataset.witness import check_row
from octstage.errors import OctstageError
from octstage.manifest import Intensity, Normalization, Volume
from octstage.provenance import config_hash

INVENTORY_FORMAT = "octstage-inventory/1"
RECORD_FORMAT = "octstage-record/1"
DEFAULT_INVENTORY = "_octstage/inventory.json"
# Where the layout puts OCT volumes under a dataset root, most specific first.
OCT_PREFIXES = ("retinal_oct/structural_oct/", "structural_oct/")
# The category of a failure of the machine, not the bytes: retried next run, never stored.
ENVIRONMENT = "environment"


def software_versions() -> dict[str, str]:
    """What, besides the parameters, decides a cached volume's values: pydicom and every
    decoder plugin's version, OpenCV's, and the hand-bumped preprocessing code version."""
    return {**dicom.decoder_versions(), **normalize.preprocess_versions()}


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's share, not the host's)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def capped_workers(asked: int, items: int, cores: int, flag: str, what: str) -> tuple[int, str]:
    """Local worker processes for ``items`` units of work (plates, files) on ``cores`` cores:
    ``asked`` capped at both, at least 1 (64 processes for two plates on two cores took 35
    times as long as two: each process starts, imports and competes for the cores); and the
    line that says so ("" when nothing was capped)."""
    n = max(1, min(asked, items, cores))
    if n >= asked:
        return asked, ""
    return n, (
        f"{flag} {asked}: {items} {what}(s) on {cores} core(s): starting {n} worker "
        "process(es); more would only wait, or compete for the cores"
    )


def software_mismatch(driver: Mapping[str, str], workers: Mapping[str, Mapping[str, str]]) -> str:
    """Why a cluster cannot build into one cache ("" when it can): every worker must decode with
    the driver's software, or the driver would look for volumes under keys nobody writes and
    one cache would mix two decoders' output."""
    problems = []
    for worker, versions in sorted(workers.items()):
        diff = sorted(
            f"{name} {versions.get(name, 'missing')} (driver {driver.get(name, 'missing')})"
            for name in set(driver) | set(versions)
            if versions.get(name) != driver.get(name)
        )
        if diff:
            problems.append(f"{worker}: {', '.join(diff)}")
    return "; ".join(problems)


def cache_key(
    source_sha1: str, config: BuildConfig, software: Mapping[str, str] | None = None
) -> str:
    """Same source bytes + same parameters (incl. the cache version) + same decoding and
    preprocessing software (``software_versions``) = same key = same volume. A new decoder
    version therefore rebuilds volumes instead of mixing two decoders' output in one cache."""
    versions = software_versions() if software is None else software
    text = f"{source_sha1}:{config.params_hash()}:{config_hash(dict(versions))}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class InventoryEntry:
    """What the mirror recorded about one source object."""

    size: int
    sha1: str | None


def parse_inventory(data: Any, source: str) -> dict[str, InventoryEntry]:
    """The ``objects`` of an ``octstage-inventory/1`` document, by name."""
    if not isinstance(data, dict) or data.get("format") != INVENTORY_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise OctstageError(f"{source}: not an {INVENTORY_FORMAT} document (format {found!r})")
    entries: dict[str, InventoryEntry] = {}
    try:
        for obj in data["objects"]:
            sha1 = obj.get("sha1")
            entries[str(obj["name"])] = InventoryEntry(
                size=int(obj["size"]), sha1=str(sha1).lower() if sha1 else None
            )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise OctstageError(f"{source}: malformed inventory entry: {exc!r}") from exc
    return entries


@dataclass(frozen=True)
class Candidate:
    """A source file that passed every check possible without reading it."""

    name: str
    size: int
    participant_id: str
    expected_sha1: str | None  # from the inventory; None = not verifiable (recorded as such)


def precheck(
    name: str,
    size: int,
    participants: Mapping[str, Participant],
    inventory: Mapping[str, InventoryEntry] | None,
    excluded: Mapping[str, str] | None = None,
) -> Candidate | str:
    """A Candidate, or the rejection reason decided from the path, labels and inventory alone;
    ``excluded`` gives the reason for a participant the label table left out on purpose."""
    path_only = resolve(name, None)
    # With no PatientID given, "PatientID missing" is the answer for every well-formed path.
    if path_only.kind is not Reason.PATIENT_ID_MISSING:
        layout = path_only.kind in (Reason.NOT_IN_LAYOUT, Reason.UNKNOWN_DEVICE)
        category = "layout" if layout else "participant ID"
        return f"{category}: {path_only.reason}"
    path = parse_oct_path(name)
    assert path is not None  # resolve() accepted the layout
    pid = path.folder_id
    if excluded and pid in excluded:
        return f"no label: {excluded[pid]}"
    if pid not in participants:
        return f"no label: participant {pid} has no usable row in participants.tsv"
    expected = None
    if inventory is not None:
        entry = inventory.get(name)
        if entry is not None:
            if entry.size != size:
                return f"inventory: size {size} differs from the inventory's {entry.size}"
            expected = entry.sha1
    return Candidate(name=name, size=size, participant_id=pid, expected_sha1=expected)


def sha1_mismatch(name: str, expected: str, actual: str) -> str:
    return f"SHA1 mismatch: {name} reads as {actual}, the source inventory says {expected}"


@dataclass(frozen=True)
class Record:
    """Everything about one built volume that the manifest needs, stored beside the cache.

    Written once the volume is complete; reading it is how a re-run reuses a volume without
    decoding its source. Only the header fields the manifest lists are kept (no PHI).
    """

    cache_key: str
    source_sha1: str
    source_size: int
    patient_id: str
    laterality: str
    transfer_syntax: str
    source_shape: tuple[int, int, int]
    spacing_mm: tuple[float, float, float]
    zarr_path: str
    shape: tuple[int, int, int]
    dtype: str
    normalization: Normalization
    checksum: str
    intensity: Intensity | None = None  # records written before it have none

    def to_dict(self) -> dict[str, Any]:
        extra = {} if self.intensity is None else {"intensity": asdict(self.intensity)}
        return extra | {
            "format": RECORD_FORMAT,
            "cache_key": self.cache_key,
            "source_sha1": self.source_sha1,
            "source_size": self.source_size,
            "patient_id": self.patient_id,
            "laterality": self.laterality,
            "transfer_syntax": self.transfer_syntax,
            "source_shape": list(self.source_shape),
            "spacing_mm": list(self.spacing_mm),
            "zarr_path": self.zarr_path,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "normalization": asdict(self.normalization),
            "checksum": self.checksum,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Record:
        """Raises ValueError for anything but a complete record of this format."""
        if data.get("format") != RECORD_FORMAT:
            raise ValueError(f"not an {RECORD_FORMAT} record")
        try:
            return cls(
                cache_key=str(data["cache_key"]),
                source_sha1=str(data["source_sha1"]),
                source_size=int(data["source_size"]),
                patient_id=str(data["patient_id"]),
                laterality=str(data["laterality"]),
                transfer_syntax=str(data["transfer_syntax"]),
                source_shape=_triple(data["source_shape"], int),
                spacing_mm=_triple(data["spacing_mm"], float),
                zarr_path=str(data["zarr_path"]),
                shape=_triple(data["shape"], int),
                dtype=str(data["dtype"]),
                normalization=Normalization(**data["normalization"]),
                checksum=str(data["checksum"]),
                intensity=_intensity(data.get("intensity")),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"incomplete record: {exc!r}") from exc


def _intensity(raw: Any) -> Intensity | None:
    if raw is None:
        return None
    return Intensity(tuple(float(x) for x in raw["mean"]), tuple(float(x) for x in raw["std"]))


def _triple(values: Sequence[Any], kind: type[Any]) -> Any:
    if len(values) != 3:
        raise ValueError(f"expected 3 values, got {values!r}")
    return (kind(values[0]), kind(values[1]), kind(values[2]))


def resolve_laterality(header: str | None, from_name: str | None) -> str:
    """The eye, from the header (authoritative) checked against the file name; ValueError if
    neither says or they disagree."""
    if header and from_name and header != from_name:
        raise ValueError(f"laterality: header says {header}, file name says {from_name}")
    value = header or from_name
    if value not in ("L", "R"):
        raise ValueError("laterality: neither ImageLaterality/Laterality nor the file name says")
    return value


def header_verdict(
    name: str, patient_id: str | None, laterality: str | None
) -> tuple[str, str] | str:
    """``(participant_id, laterality)`` when the header fits the file's path, else the reason."""
    resolution = resolve(name, patient_id)
    if resolution.participant_id is None:
        return f"participant ID: {resolution.reason}"
    path = parse_oct_path(name)
    assert path is not None  # resolve() accepted the layout
    try:
        return resolution.participant_id, resolve_laterality(laterality, path.laterality)
    except ValueError as exc:
        return str(exc)


def volume_entry(
    name: str,
    record: Record,
    participant: Participant,
    row: TsvRow | None = None,
    clinical: Mapping[int, Mapping[str, float]] | None = None,
) -> Volume | str:
    """The manifest entry for a built (or reused) volume, or why this path may not use it.

    Checks the ID and the eye again from the record, so a reused volume is held to the same
    rules as a fresh one even if the file was moved or renamed since; then the file's row in the
    release's manifest.tsv (``row``), which must agree too and gives the anatomic region.
    ``clinical`` (concept id -> participant -> value) fills the volume's clinical values.
    """
    verdict = header_verdict(name, record.patient_id, record.laterality)
    if isinstance(verdict, str):
        return verdict
    participant_id, laterality = verdict
    path = parse_oct_path(name)
    assert path is not None
    model, region, size = DEVICE_MODELS.get(path.device, ("", ""))[1], "", ""
    if row is not None:
        disagreement = check_row(
            row,
            device=path.device,
            participant_id=participant_id,
            laterality=laterality,
            shape=record.source_shape,
        )
        if disagreement is not None:
            return f"{TSV_NAME}: {disagreement[1]}"
        model, (region, size) = row.model, split_region(row.anatomic_region)
    values = {
        str(concept): by_pid[participant_id]
        for concept, by_pid in (clinical or {}).items()
        if participant_id in by_pid
    }
    return Volume(
        participant_id=participant_id,
        device=path.device,
        laterality=laterality,
        protocol=path.protocol or "",
        split=participant.split,
        study_group=participant.study_group,
        label=participant.label,
        source_path=name,
        source_sha1=record.source_sha1,
        source_size=record.source_size,
        transfer_syntax=record.transfer_syntax,
        source_shape=record.source_shape,
        spacing_mm=record.spacing_mm,
        zarr_path=record.zarr_path,
        shape=record.shape,
        dtype=record.dtype,
        normalization=record.normalization,
        intensity=record.intensity,
        checksum=record.checksum,
        cache_key=record.cache_key,
        device_model=model,
        anatomic_region=region,
        scan_size=size,
        clinical=values,
    )


def reason_category(reason: str) -> str:
    """``"SHA1 mismatch: ..."`` -> ``"SHA1 mismatch"`` (what the summary counts)."""
    return reason.split(":", 1)[0]


@dataclass
class Tally:
    """Running counts of a build, for its summary."""

    built: int = 0
    reused: int = 0
    read: int = 0  # sources streamed and hashed
    decoded: int = 0  # pixel decodes (a re-run over an unchanged cache does none)
    unverified: int = 0  # sources with no SHA1 in an inventory to check against

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


def summary(
    tally: Tally,
    volumes: Sequence[Volume],
    rejected: Iterable[tuple[str, str]],
    seconds: float,
    label_problems: int,
) -> dict[str, Any]:
    """The machine-readable build summary (``--json``); the table prints the same numbers."""
    reasons = Counter(reason_category(reason) for _, reason in rejected)
    devices = Counter(v.device for v in volumes)
    return {
        **tally.as_dict(),
        "volumes": len(volumes),
        "participants": len({v.participant_id for v in volumes}),
        "rejected": sum(reasons.values()),
        "rejected_by_reason": dict(sorted(reasons.items())),
        ENVIRONMENT: reasons.get(ENVIRONMENT, 0),
        "by_device": dict(sorted(devices.items())),
        "label_problems": label_problems,
        "seconds": round(seconds, 3),
        "built_per_second": round(tally.built / seconds, 3) if seconds > 0 else None,
    }


def qc_sample(volumes: Sequence[Volume], per_device: int) -> list[Volume]:
    """Up to ``per_device`` volumes of each device, spread evenly over the manifest order."""
    picked: list[Volume] = []
    for device in sorted({v.device for v in volumes}):
        mine = [v for v in volumes if v.device == device]
        step = max(1, len(mine) // per_device)
        picked.extend(mine[::step][:per_device])
    return picked
