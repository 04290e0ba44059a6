"""A manifest's JSON form: ``to_dict``/``from_dict``, and ``load``/``write`` of the file (written
atomically, read from local disk only)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from octstage.errors import ManifestError
from octstage.manifest.model import (
    CACHE_VERSION,
    KINDS,
    SCHEMA_VERSION,
    ChannelSource,
    Concept,
    Field,
    Header,
    Intensity,
    Manifest,
    Normalization,
    Rejected,
    Volume,
)
from octstage.outputs import atomic_write_text


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
