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

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from octstage.errors import ManifestError as ManifestError  # octtrain catches it from here
from octstage.outputs import atomic_write_bytes as atomic_write_bytes
from octstage.outputs import atomic_write_text as atomic_write_text

# The one rule for output folders (octstage/outputs.py), for octtrain too: this module is the only
# one of octstage that octtrain imports.
from octstage.outputs import check_feature_cache as check_feature_cache
from octstage.outputs import check_output_folder as check_output_folder
from octstage.outputs import claim_run_folder as claim_run_folder
from octstage.outputs import move_aside as move_aside
from octstage.outputs import replace_report as replace_report

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


# What ``check`` looks for, by name: the consumers differ only in which of these are fatal.
CHECKS = ("kind", "empty", "duplicate", "split", "label", "shape", "shared-source")
# Which findings stop each consumer before any work (the rest are warnings); see ``refuse``.
# pretrain reads no labels, and an item in two splits only biases its validation figures (a
# warning); profile scores every field whatever its split. The rest stop on every finding.
# ``octtrain doctor`` applies the set of the job its config launches (pretrain or finetune).
FATAL: dict[str, frozenset[str]] = {
    **{c: frozenset(CHECKS) for c in ("verify", "stage", "finetune", "evaluate")},
    "probe": frozenset(CHECKS),
    "pretrain": frozenset(CHECKS) - {"label", "split"},
    "profile": frozenset(CHECKS) - {"split"},
}


@dataclass(frozen=True)
class Finding:
    """One way a manifest contradicts itself or its consumer; ``check`` is one of CHECKS."""

    check: str
    message: str


def check(manifest: Manifest, kind: str | None = None) -> list[Finding]:
    """Every contradiction of the manifest, per kind, one finding each (empty when none).

    ``kind`` is what the consumer reads ("oct" or "cellpainting"; None: either). Both kinds:
    the kind expected, no items, an item listed twice (``zarr_path``, ``cache_key``, its id),
    a label outside ``classes`` or naming another class than the item says, shapes that differ
    or do not fit the dtype and channels. OCT: a participant in two splits or two study groups,
    a source file listed twice, a volume path under another participant's folder. Cell
    Painting: a plate in two splits, two fields naming the same source file (they would share
    one array's data), a field stored under another plate's folder.
    """
    found: list[Finding] = []
    if kind is not None and manifest.kind != kind:
        n = len(manifest.items)
        found.append(
            Finding(
                "kind",
                f"expected a manifest of kind {kind!r}, found kind {manifest.kind!r} "
                f"({n} {'fields' if manifest.kind == 'cellpainting' else 'volumes'}); this needs "
                f"a cache built with `octstage build-cache --kind {kind}`",
            )
        )
        return found
    items = manifest.items
    what = "fields" if manifest.kind == "cellpainting" else "volumes"
    if not items:
        found.append(Finding("empty", f"lists no {what}: a cache with nothing to read"))
    other = manifest.volumes if manifest.kind == "cellpainting" else manifest.fields
    if other:
        found.append(
            Finding("kind", f"kind {manifest.kind!r} but it also lists {len(other)} other items")
        )
    if manifest.kind == "cellpainting":
        found += _field_findings(manifest)
    else:
        found += _volume_findings(manifest)
    shapes: dict[tuple[int, ...], int] = {}
    for n, item in enumerate(items):
        shapes.setdefault(tuple(item.shape), n)
        if len(item.shape) != 3 or min(item.shape) < 1 or item.dtype != "uint8":
            found.append(
                Finding(
                    "shape",
                    f"{what}[{n}] ({item.zarr_path}): shape {list(item.shape)} dtype "
                    f"{item.dtype}, expected 3 positive sizes of uint8",
                )
            )
    if len(shapes) > 1:
        listed = ", ".join(f"{list(s)} at {what}[{n}]" for s, n in list(shapes.items())[:4])
        found.append(Finding("shape", f"{what} of {len(shapes)} shapes: {listed}"))
    return found


def _duplicates(items: tuple[Item, ...], what: str, keys: tuple[str, ...]) -> list[Finding]:
    found = []
    for key in keys:
        seen: dict[object, int] = {}
        for n, item in enumerate(items):
            value = getattr(item, key)
            if value in seen:
                found.append(
                    Finding(
                        "duplicate",
                        f"{what}[{n}]: {key} {value!r} already listed at {what}[{seen[value]}]",
                    )
                )
            else:
                seen[value] = n
    return found


def _volume_findings(manifest: Manifest) -> list[Finding]:
    found = _duplicates(manifest.items, "volumes", ("zarr_path", "source_path", "cache_key"))
    for field_name, what in (("split", "splits"), ("study_group", "study groups")):
        values: dict[str, set[str]] = {}
        for v in manifest.volumes:
            values.setdefault(v.participant_id, set()).add(getattr(v, field_name))
        for pid, seen in sorted(values.items()):
            if len(seen) > 1:
                check_name = "split" if field_name == "split" else "label"
                found.append(
                    Finding(
                        check_name,
                        f"participant {pid}: in {len(seen)} {what}: {', '.join(sorted(seen))}",
                    )
                )
    for n, v in enumerate(manifest.volumes):
        if not 0 <= v.label < len(manifest.classes):
            found.append(
                Finding(
                    "label",
                    f"volumes[{n}] ({v.zarr_path}): label {v.label} outside the "
                    f"{len(manifest.classes)} classes",
                )
            )
        elif manifest.classes[v.label] != v.study_group:
            found.append(
                Finding(
                    "label",
                    f"volumes[{n}] ({v.zarr_path}): label {v.label} is class "
                    f"{manifest.classes[v.label]!r}, study_group says {v.study_group!r}",
                )
            )
        parts = v.zarr_path.split("/")
        if len(parts) < 3 or parts[0] != "volumes" or parts[1] != v.participant_id:
            found.append(
                Finding(
                    "shared-source",
                    f"volumes[{n}]: participant {v.participant_id}'s volume at {v.zarr_path!r}, "
                    f"not under volumes/{v.participant_id}/ (another participant's data?)",
                )
            )
    return found


def _field_findings(manifest: Manifest) -> list[Finding]:
    found = _duplicates(manifest.items, "fields", ("zarr_path", "cache_key", "item_id"))
    plates: dict[str, set[str]] = {}
    sources: dict[str, int] = {}
    for n, f in enumerate(manifest.fields):
        plates.setdefault(f.plate, set()).add(f.split)
        for s in f.sources:
            if s.path in sources and sources[s.path] != n:
                found.append(
                    Finding(
                        "shared-source",
                        f"fields[{n}] ({f.item_id}): source {s.path!r} is also "
                        f"fields[{sources[s.path]}]'s ({manifest.fields[sources[s.path]].item_id})",
                    )
                )
            sources.setdefault(s.path, n)
        parts = f.zarr_path.split("/")
        if len(parts) < 3 or parts[0] != "fields" or parts[1] != f.plate:
            found.append(
                Finding(
                    "shared-source",
                    f"fields[{n}] ({f.item_id}): of plate {f.plate} but stored at "
                    f"{f.zarr_path!r}, not under fields/{f.plate}/",
                )
            )
        if f.label is not None and not 0 <= f.label < len(manifest.classes):
            found.append(
                Finding(
                    "label",
                    f"fields[{n}] ({f.item_id}): label {f.label} outside the "
                    f"{len(manifest.classes)} classes",
                )
            )
        elif f.label is not None and manifest.classes[f.label] != f.perturbation:
            found.append(
                Finding(
                    "label",
                    f"fields[{n}] ({f.item_id}): label {f.label} is class "
                    f"{manifest.classes[f.label]!r}, perturbation says {f.perturbation!r}",
                )
            )
        if f.shape[0] != len(f.channels) or len(f.sources) != len(f.channels):
            found.append(
                Finding(
                    "shape",
                    f"fields[{n}] ({f.item_id}): {len(f.channels)} channels, shape "
                    f"{list(f.shape)} and {len(f.sources)} source files",
                )
            )
    for plate, seen in sorted(plates.items()):
        if len(seen) > 1:
            found.append(
                Finding("split", f"plate {plate}: in {len(seen)} splits: {', '.join(sorted(seen))}")
            )
    return found


def consistency_problems(manifest: Manifest) -> list[str]:
    """Every finding of ``check`` (either kind), one line each: what ``verify`` reports."""
    return [f"{f.check}: {f.message}" for f in check(manifest)]


def refuse(
    manifest: Manifest,
    source: str,
    consumer: str,
    error: type[Exception],
    kind: str | None = None,
    warn: Callable[[str], object] | None = None,
) -> list[Finding]:
    """Run ``check`` before ``consumer``'s work: raise ``error`` naming ``source`` and the
    fatal findings (``FATAL[consumer]``), hand each other finding to ``warn``; returns them."""
    findings = check(manifest, kind)
    fatal = [f for f in findings if f.check in FATAL[consumer]]
    if fatal:
        lines = "; ".join(f"{f.check}: {f.message}" for f in fatal[:5])
        more = f" (and {len(fatal) - 5} more)" if len(fatal) > 5 else ""
        raise error(f"{source}: {consumer} refuses this manifest: {lines}{more}")
    rest = [f for f in findings if f.check not in FATAL[consumer]]
    for f in rest:
        if warn is not None:
            warn(f"{source}: {f.check}: {f.message} (not fatal for {consumer})")
    return rest


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
