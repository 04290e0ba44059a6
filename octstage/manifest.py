"""The manifest: the one contract between octstage and octtrain.

A manifest is one JSON file (schema in ``octstage/manifest.schema.json``, shipped with the
package) listing every cached item with its labels, provenance and a checksum of the stored
array, plus every rejected source file with its reason. It is written last and atomically;
readers check the schema and cache versions before trusting anything. This module imports neither
torch nor any cloud SDK.

Two kinds of data share the one schema (``Manifest.kind``):

- ``"oct"`` (the default; a manifest without ``kind`` is one): ``Manifest.volumes`` lists
  ``Volume`` items, uint8 ``[frames, rows, columns]`` OCT volumes of AI-READI.
- ``"cellpainting"``: ``Manifest.fields`` lists ``Field`` items, uint8 ``[C, Y, X]`` Cell Painting
  fields of view (JUMP layout); ``volumes`` is empty.

Every item has the common part: an id (``participant_id`` + source for a volume, ``item_id`` for
a field), ``split``, ``label`` (an index into ``Manifest.classes``; a field's may be None),
``zarr_path`` (OME-Zarr group; the array is ``array_path`` = ``f"{zarr_path}/0"``), ``shape``,
``dtype``, ``checksum`` (``"sha256:<hex>"`` of the array's values in C order), ``cache_key`` and
its source files with their hashes; the rest is typed per kind. ``Manifest.items`` gives the
common part of either kind (what ``verify`` and ``stage`` need).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from octstage.errors import ManifestError as ManifestError  # octtrain catches it from here

SCHEMA_VERSION = 1
# The kinds of data a manifest can list (``Manifest.kind``); absent in JSON means "oct".
KINDS = ("oct", "cellpainting")
# Cell Painting channels in JUMP's order of the load-data columns (FileName_Orig<channel>).
CELLPAINTING_CHANNELS = ("DNA", "AGP", "ER", "Mito", "RNA")
# What a field's perturbation is; "negcon" marks negative controls (DMSO, non-targeting, ...),
# "" a field whose plate and well the metadata does not list.
PERTURBATION_TYPES = ("compound", "orf", "crispr", "negcon", "")
# The manifest's JSON Schema, package data beside this module (verify and stage read it).
SCHEMA_PATH = Path(__file__).with_name("manifest.schema.json")
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
    volumes: tuple[Volume, ...]
    rejected: tuple[Rejected, ...] = field(default=())
    schema_version: int = SCHEMA_VERSION
    concepts: tuple[Concept, ...] = field(default=())
    kind: Literal["oct", "cellpainting"] = "oct"
    fields: tuple[Field, ...] = field(default=())

    def split(self, name: str) -> tuple[Volume, ...]:
        """The volumes of one split, in manifest order."""
        return tuple(v for v in self.volumes if v.split == name)

    def split_fields(self, name: str) -> tuple[Field, ...]:
        """The Cell Painting fields of one split, in manifest order."""
        return tuple(f for f in self.fields if f.split == name)

    @property
    def items(self) -> tuple[Item, ...]:
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


def consistency_problems(manifest: Manifest) -> list[str]:
    """What makes a manifest contradict itself, one line each (empty when consistent): a volume
    listed twice (by ``zarr_path``, ``source_path`` or ``cache_key``: a trainer would use it
    twice), a participant in two splits or two study groups (its volumes would leak between
    splits), a label outside ``classes`` or one that names another class than ``study_group``."""
    problems: list[str] = []
    for key in ("zarr_path", "source_path", "cache_key"):
        seen: dict[str, int] = {}
        for n, v in enumerate(manifest.volumes):
            value = getattr(v, key)
            if value in seen:
                problems.append(
                    f"volumes[{n}]: {key} {value!r} already listed at volumes[{seen[value]}]"
                )
            else:
                seen[value] = n
    for field_name, what in (("split", "splits"), ("study_group", "study groups")):
        values: dict[str, set[str]] = {}
        for v in manifest.volumes:
            values.setdefault(v.participant_id, set()).add(getattr(v, field_name))
        for pid, found in sorted(values.items()):
            if len(found) > 1:
                problems.append(
                    f"participant {pid}: in {len(found)} {what}: {', '.join(sorted(found))}"
                )
    for n, v in enumerate(manifest.volumes):
        if not 0 <= v.label < len(manifest.classes):
            problems.append(
                f"volumes[{n}] ({v.zarr_path}): label {v.label} outside the "
                f"{len(manifest.classes)} classes"
            )
        elif manifest.classes[v.label] != v.study_group:
            problems.append(
                f"volumes[{n}] ({v.zarr_path}): label {v.label} is class "
                f"{manifest.classes[v.label]!r}, study_group says {v.study_group!r}"
            )
    return problems


def field_counts(fields: tuple[Field, ...] | list[Field], rejected: int) -> dict[str, Any]:
    """Counts for a Cell Painting manifest header: fields, plates, wells, controls, rejected,
    by split, plate and perturbation type."""
    by: dict[str, dict[str, int]] = {"split": {}, "plate": {}, "type": {}}
    for f in fields:
        for key, value in (
            ("split", f.split),
            ("plate", f.plate),
            ("type", f.perturbation_type or "unknown"),
        ):
            by[key][value] = by[key].get(value, 0) + 1
    return {
        "fields": len(fields),
        "plates": len({f.plate for f in fields}),
        "wells": len({(f.plate, f.well) for f in fields}),
        "controls": sum(f.is_control for f in fields),
        "rejected": rejected,
        "by_split": by["split"],
        "by_plate": by["plate"],
        "by_perturbation_type": by["type"],
    }


def to_dict(manifest: Manifest) -> dict[str, Any]:
    """The JSON form of a manifest (see octstage/manifest.schema.json)."""
    out: dict[str, Any] = {
        "schema_version": manifest.schema_version,
        "kind": manifest.kind,
        "header": asdict(manifest.header),
        "classes": list(manifest.classes),
        "volumes": [_volume_to_dict(v) for v in manifest.volumes],
        "rejected": [asdict(r) for r in manifest.rejected],
    }
    if manifest.kind == "cellpainting":
        out["fields"] = [_field_to_dict(f) for f in manifest.fields]
    if manifest.concepts:
        out["concepts"] = [asdict(c) for c in manifest.concepts]
    return out


def _field_to_dict(f: Field) -> dict[str, Any]:
    d = asdict(f)
    for key in ("shape", "channels"):
        d[key] = list(d[key])
    for key in ("sources", "illum", "normalization"):
        d[key] = [dict(x) for x in d[key]]
    return _intensity_to_dict(d)


def _intensity_to_dict(d: dict[str, Any]) -> dict[str, Any]:
    """An item's ``intensity`` as JSON lists, or no key at all when it was not measured."""
    if d.get("intensity") is None:
        d.pop("intensity", None)
    else:
        d["intensity"] = {k: list(v) for k, v in d["intensity"].items()}
    return d


def _intensity_from_dict(d: dict[str, Any]) -> None:
    raw = d.get("intensity")
    if raw is not None:
        d["intensity"] = Intensity(
            tuple(float(x) for x in raw["mean"]), tuple(float(x) for x in raw["std"])
        )


def _field_from_dict(d: dict[str, Any]) -> Field:
    d = dict(d)
    d["shape"] = tuple(d["shape"])
    d["channels"] = tuple(str(c) for c in d["channels"])
    d["sources"] = tuple(ChannelSource(**s) for s in d["sources"])
    d["illum"] = tuple(ChannelSource(**s) for s in d.get("illum", ()))
    d["normalization"] = tuple(Normalization(**n) for n in d["normalization"])
    _intensity_from_dict(d)
    return Field(**d)


def _volume_to_dict(v: Volume) -> dict[str, Any]:
    d = asdict(v)
    for key in ("source_shape", "spacing_mm", "shape"):
        d[key] = list(d[key])
    return _intensity_to_dict(d)


def from_dict(data: dict[str, Any], source: str = "<manifest>") -> Manifest:
    """Build a Manifest from its JSON form; any mismatch raises ManifestError naming ``source``."""
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != SCHEMA_VERSION:
        raise ManifestError(
            f"{source}: manifest schema version {version!r}, this code reads {SCHEMA_VERSION}; "
            "rebuild the cache with this version of octstage"
        )
    try:
        header = Header(**data["header"])
        if header.cache_version != CACHE_VERSION:
            raise ManifestError(
                f"{source}: cache version {header.cache_version}, this code expects "
                f"{CACHE_VERSION}; rebuild the cache (octstage build-cache)"
            )
        kind = data.get("kind", "oct")
        if kind not in KINDS:
            raise ManifestError(
                f"{source}: manifest kind {kind!r} is not one of {', '.join(KINDS)}; "
                "upgrade octstage or rebuild the cache"
            )
        volumes = tuple(_volume_from_dict(v) for v in data["volumes"])
        fields = tuple(_field_from_dict(f) for f in data.get("fields", ()))
        rejected = tuple(Rejected(**r) for r in data["rejected"])
        classes = tuple(str(c) for c in data["classes"])
        concepts = tuple(Concept(**c) for c in data.get("concepts", ()))
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"{source}: malformed manifest: {exc!r}") from exc
    return Manifest(header, classes, volumes, rejected, concepts=concepts, kind=kind, fields=fields)


def _volume_from_dict(d: dict[str, Any]) -> Volume:
    d = dict(d)
    d["normalization"] = Normalization(**d["normalization"])
    for key in ("source_shape", "spacing_mm", "shape"):
        d[key] = tuple(d[key])
    d["clinical"] = {str(k): float(x) for k, x in d.get("clinical", {}).items()}
    _intensity_from_dict(d)
    return Volume(**d)


def load(path: str | os.PathLike[str]) -> Manifest:
    """Read and check a manifest file from local disk (no remote calls, no listing)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ManifestError(f"{p}: cannot read manifest: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{p}: not valid JSON: {exc}") from exc
    return from_dict(data, source=str(p))


def write(manifest: Manifest, path: str | os.PathLike[str]) -> None:
    """Write atomically: a reader sees the old file or the complete new one, never a part."""
    atomic_write_text(Path(path), json.dumps(to_dict(manifest), indent=1, sort_keys=False) + "\n")


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) atomically, as ``atomic_write_bytes`` does."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the complete new one.

    Only a regular file (or a name not yet taken) is written atomically: to a temporary file
    beside it, fsynced, then renamed over it (the temporary is removed on any failure). A
    symlink is followed and its target written the same way, so the link stays a link. Anything
    else (a FIFO, ``/dev/stdout``, ``/dev/null``, a terminal) is written in place: renaming over
    it would replace the pipe or device with a new regular file that nobody reads. A directory
    is refused. Any OSError names the path it concerns.
    """
    target = Path(os.path.realpath(path))  # every link in the chain followed
    try:
        mode: int | None = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise _named(exc, path) from None
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a file to write", str(path))
    if mode is not None and not stat.S_ISREG(mode):
        try:
            with open(target, "wb") as fh:  # a FIFO blocks here until a reader opens it
                fh.write(data)
        except OSError as exc:
            raise _named(exc, path) from None
        return
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise _named(exc, path) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _named(exc, path) from None
        raise


def _named(exc: OSError, path: Path) -> OSError:
    """The same error, naming ``path`` (a failed ``write`` or ``fsync`` names no file)."""
    if exc.errno is None:  # raised by hand, with its own message
        return exc
    return OSError(exc.errno, exc.strerror, str(path))
