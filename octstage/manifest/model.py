"""The manifest's items and header as typed dataclasses, its constants, and the header's counts.

The package's docstring (``octstage.manifest``) says what a manifest holds; ``checks`` finds its
contradictions, ``serial`` reads and writes its JSON form.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

SCHEMA_VERSION = 1
# The columnar form (a JSON header and a Parquet item table, ``columnar``) is version 2: older
# octstage refuses it with its "rebuild" message instead of misreading a header without items.
TABLE_SCHEMA_VERSION = 2
# How ``write`` stores a manifest: "json" (one file, every item in it) or "table" (the header
# and ``<stem>.items.parquet``; for caches of a million items). ``load`` reads either.
FORMS = ("json", "table")
# The kinds of data a manifest can list (``Manifest.kind``); absent in JSON means "oct".
KINDS = ("oct", "cellpainting")
# Cell Painting channels in JUMP's order of the load-data columns (FileName_Orig<channel>).
CELLPAINTING_CHANNELS = ("DNA", "AGP", "ER", "Mito", "RNA")
# What a field's perturbation is; "negcon" marks negative controls (DMSO, non-targeting, ...),
# "" a field whose plate and well the metadata does not list.
PERTURBATION_TYPES = ("compound", "orf", "crispr", "negcon", "poscon", "empty", "")
# The manifest's JSON Schema, package data of octstage (verify and stage read it).
SCHEMA_PATH = Path(__file__).resolve().parent.parent / "manifest.schema.json"
# Bump when anything changes what a cached volume contains for the same source and parameters.
CACHE_VERSION = 1


@dataclass(frozen=True)
class Normalization:
    """How raw intensities became uint8: clip to [low, high] (the p_low/p_high percentiles)."""

    p_low: float
    p_high: float
    low: float
    high: float


@dataclass(frozen=True)
class Intensity:
    """Mean and standard deviation of a stored uint8 array's values, per channel (an OCT volume
    has one), measured when build-cache wrote it: what the trainer standardises its input with.
    Manifests built before it have none (``None`` on the item)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def of(cls, array: Any, channels_first: bool) -> Intensity:
        """The statistics of a numpy array: per leading channel, or of the whole array."""
        rows = array.reshape(array.shape[0] if channels_first else 1, -1)
        mean = rows.mean(axis=1, dtype="float64")
        std = rows.std(axis=1, dtype="float64")
        return cls(tuple(round(float(m), 4) for m in mean), tuple(round(float(x), 4) for x in std))


@dataclass(frozen=True)
class Volume:
    """One cached OCT volume and everything the trainer may know about it."""

    participant_id: str
    device: str
    laterality: str  # "L" or "R"
    protocol: str
    split: str  # train / val / test (participants.tsv recommended_split)
    study_group: str
    label: int  # index of study_group in Manifest.classes
    source_path: str  # relative to the source root
    source_sha1: str
    source_size: int
    transfer_syntax: str
    source_shape: tuple[int, int, int]  # frames, rows, columns as decoded by pydicom
    spacing_mm: tuple[float, float, float]  # between frames, rows, columns
    zarr_path: str  # relative to the cache root; the OME-Zarr group, array "0" holds the data
    shape: tuple[int, int, int]
    dtype: str
    normalization: Normalization
    checksum: str  # "sha256:<hex>" of the stored array's values (C order)
    cache_key: str
    # What the release's retinal_oct/manifest.tsv says (fields added after the first manifests:
    # an older manifest loads with them empty). device_model: "Spectralis", "Maestro2", "Triton",
    # "Cirrus" (from the device folder when the source has no manifest.tsv); anatomic_region:
    # "Macula", "Optic Disc", "Wide Field" ("" = unknown: no manifest.tsv); scan_size: the scan
    # size the release spells after the region ("6 x 6", "12 x 12", in mm; "" where it gives none).
    device_model: str = ""
    anatomic_region: str = ""
    scan_size: str = ""
    # The participant's clinical values build-cache copied (--concept): concept id (as a string,
    # the JSON key) -> value; a concept the participant has no usable value for is absent.
    clinical: dict[str, float] = field(default_factory=dict)
    intensity: Intensity | None = None  # of the stored array; None in older manifests

    @property
    def array_path(self) -> str:
        """Path of the Zarr array (relative to the cache root)."""
        return f"{self.zarr_path}/0"


@dataclass(frozen=True)
class ChannelSource:
    """One source file of a Cell Painting field: a channel image (or its illumination function)."""

    channel: str  # "DNA", "AGP", "ER", "Mito", "RNA"
    path: str  # relative to the source root (the load-data table's PathName joined with FileName)
    sha1: str  # SHA1 of the file's bytes, as listed or hashed once at the source
    size: int  # bytes


@dataclass(frozen=True)
class Field:
    """One cached Cell Painting field of view (a site of a well) and what the trainer may know.

    The array at ``array_path`` is uint8 ``[C, Y, X]`` with ``channels`` in that order, each
    channel illumination-corrected (when the plate has illumination functions) and clipped to
    its plate's robust percentiles (``normalization[c]``) before scaling to 0..255.
    """

    # Common part (every kind has it).
    item_id: str  # "<source>/<plate>/<well>/<site>", unique in the manifest
    split: str  # train / val / test; all fields of a plate share one split
    label: int | None  # index of ``perturbation`` in Manifest.classes; None without metadata
    zarr_path: str  # "fields/<plate>/<cache_key>.ome.zarr"; the data is its array "0"
    shape: tuple[int, int, int]  # channels, rows, columns
    dtype: str  # "uint8"
    checksum: str  # "sha256:<hex>" of the stored array's values (C order)
    cache_key: str
    sources: tuple[ChannelSource, ...]  # one per channel, in ``channels`` order
    # Typed part (Cell Painting).
    source: str  # JUMP source, e.g. "source_4"
    batch: str
    plate: str
    well: str  # e.g. "A01"
    site: int
    channels: tuple[str, ...]  # e.g. CELLPAINTING_CHANNELS
    perturbation: str  # compound / ORF / CRISPR id (JCP2022_...), "" when unknown
    perturbation_type: str  # one of PERTURBATION_TYPES
    is_control: bool  # a negative control well (perturbation_type "negcon")
    normalization: tuple[Normalization, ...]  # per channel, in ``channels`` order
    illum: tuple[ChannelSource, ...] = ()  # illumination functions applied (empty: none)
    source_dtype: str = "uint16"  # the TIFFs' dtype (checked per file, never assumed)
    intensity: Intensity | None = None  # per channel, of the stored array; None in older manifests

    @property
    def array_path(self) -> str:
        """Path of the Zarr array (relative to the cache root)."""
        return f"{self.zarr_path}/0"


class Item(Protocol):
    """The common part of a cached item of either kind (what verify and stage read)."""

    @property
    def split(self) -> str: ...
    @property
    def zarr_path(self) -> str: ...
    @property
    def shape(self) -> tuple[int, int, int]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def checksum(self) -> str: ...
    @property
    def cache_key(self) -> str: ...
    @property
    def array_path(self) -> str: ...


@dataclass(frozen=True)
class Concept:
    """A clinical concept build-cache copied from clinical_data/ into the volumes' ``clinical``."""

    concept_id: int  # OMOP concept id, e.g. 3004410 (HbA1c)
    name: str  # the table's source value, e.g. "hba1c"
    unit: str  # e.g. "%"; "" when the table gives none
    table: str  # measurement / observation / condition_occurrence
    participants: int  # participants with a usable value
    missing: dict[str, int] = field(default_factory=dict)  # missing code -> rows dropped


@dataclass(frozen=True)
class Rejected:
    """A source file left out of the cache, and why."""

    source: str
    reason: str


@dataclass(frozen=True)
class Header:
    """Provenance of a manifest."""

    dataset: str
    created: str  # ISO 8601, UTC
    code_version: str
    cache_version: int
    config_hash: str
    config: dict[str, Any]
    counts: dict[str, Any]


@dataclass(frozen=True)
class Manifest:
    """A whole manifest; ``classes[label]`` names a volume's study group (OCT) or a field's
    perturbation (Cell Painting). ``kind`` says which of ``volumes`` / ``fields`` is used."""

    header: Header
    classes: tuple[str, ...]
    # A tuple when built or read from JSON; read from the columnar form, an ``ItemTable`` that
    # builds each item when asked (its ``column``/``where`` avoid building any).
    volumes: Sequence[Volume]
    rejected: tuple[Rejected, ...] = field(default=())
    schema_version: int = SCHEMA_VERSION
    concepts: tuple[Concept, ...] = field(default=())
    kind: Literal["oct", "cellpainting"] = "oct"
    fields: Sequence[Field] = field(default=())

    def split(self, name: str) -> tuple[Volume, ...]:
        """The volumes of one split, in manifest order (a tuple: OCT caches are thousands)."""
        return tuple(v for v in self.volumes if v.split == name)

    def split_fields(self, name: str) -> Sequence[Field]:
        """The Cell Painting fields of one split, in manifest order (of the columnar form: a
        view of the item table, no field built)."""
        where = getattr(self.fields, "where", None)  # an ItemTable (columnar) filters in Arrow
        if where is not None:
            selected: Sequence[Field] = where("split", name)
            return selected
        return tuple(f for f in self.fields if f.split == name)

    @property
    def items(self) -> Sequence[Item]:
        """Every cached item of the manifest's kind (the common part is all a caller may use)."""
        return self.fields if self.kind == "cellpainting" else self.volumes


def count_summary(
    items: tuple[Volume, ...] | list[Volume] | tuple[Field, ...] | list[Field], rejected: int
) -> dict[str, Any]:
    """Counts for the manifest header. OCT volumes: volumes, participants, by split, class,
    device and region; Cell Painting fields: see ``field_counts`` (chosen by the items' type;
    an empty list counts as OCT)."""
    if items and isinstance(items[0], Field):
        return field_counts([f for f in items if isinstance(f, Field)], rejected)
    volumes = [v for v in items if isinstance(v, Volume)]
    by: dict[str, dict[str, int]] = {"split": {}, "study_group": {}, "device": {}, "region": {}}
    for v in volumes:
        region = ", ".join(x for x in (v.anatomic_region, v.scan_size) if x) or "unknown"
        for key, value in (
            ("split", v.split),
            ("study_group", v.study_group),
            ("device", v.device),
            ("region", region),
        ):
            by[key][value] = by[key].get(value, 0) + 1
    return {
        "volumes": len(volumes),
        "participants": len({v.participant_id for v in volumes}),
        "rejected": rejected,
        "by_split": by["split"],
        "by_study_group": by["study_group"],
        "by_device": by["device"],
        "by_region": by["region"],
    }


def field_counts(fields: Iterable[Field], rejected: int) -> dict[str, Any]:
    """Counts for a Cell Painting manifest header: fields, plates, wells, controls, rejected,
    by split, plate and perturbation type."""
    tally = FieldTally()
    for f in fields:
        tally.add(f)
    return tally.counts(rejected)


@dataclass
class FieldTally:
    """``field_counts`` kept as fields come (a build streams them; none is kept)."""

    fields: int = 0
    controls: int = 0
    wells: set[tuple[str, str]] = field(default_factory=set)
    by_split: dict[str, int] = field(default_factory=dict)
    by_plate: dict[str, int] = field(default_factory=dict)
    by_type: dict[str, int] = field(default_factory=dict)
    perturbations: set[str] = field(default_factory=set)  # the classes, once sorted

    def add(self, f: Field) -> None:
        self.fields += 1
        self.controls += f.is_control
        self.wells.add((f.plate, f.well))
        for by, value in (
            (self.by_split, f.split),
            (self.by_plate, f.plate),
            (self.by_type, f.perturbation_type or "unknown"),
        ):
            by[value] = by.get(value, 0) + 1
        if f.perturbation:
            self.perturbations.add(f.perturbation)

    def merge(self, other: FieldTally) -> None:
        self.fields += other.fields
        self.controls += other.controls
        self.wells |= other.wells
        for mine, theirs in (
            (self.by_split, other.by_split),
            (self.by_plate, other.by_plate),
            (self.by_type, other.by_type),
        ):
            for k, n in theirs.items():
                mine[k] = mine.get(k, 0) + n
        self.perturbations |= other.perturbations

    def counts(self, rejected: int) -> dict[str, Any]:
        return {
            "fields": self.fields,
            "plates": len(self.by_plate),
            "wells": len(self.wells),
            "controls": self.controls,
            "rejected": rejected,
            "by_split": dict(self.by_split),
            "by_plate": dict(self.by_plate),
            "by_perturbation_type": dict(self.by_type),
        }
