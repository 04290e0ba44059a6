"""A manifest's two forms on disk and their one reader: ``to_dict``/``from_dict`` (the JSON
form), ``to_header`` (the columnar form's header; its items are ``columnar``'s Parquet table), and
``load``/``write`` of the file (written atomically, read from local disk only). ``load`` tells
the forms apart by the header's ``table`` key; every consumer gets the same ``Manifest``."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from octstage.atomic import atomic_write_text
from octstage.errors import ManifestError, ManifestTypeError
from octstage.manifest.columnar import FORMAT as TABLE_FORMAT
from octstage.manifest.columnar import TableInfo, items_name, json_row, read_items, write_items
from octstage.manifest.itemtable import ItemTable
from octstage.manifest.itemtypes import parse, refusal, refuse_types, table_problems
from octstage.manifest.model import (
    CACHE_VERSION,
    FORMS,
    KINDS,
    SCHEMA_VERSION,
    TABLE_SCHEMA_VERSION,
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
from octstage.outputs import ITEMS_SUFFIX


def to_dict(manifest: Manifest) -> dict[str, Any]:
    """The JSON form of a manifest (see octstage/manifest.schema.json)."""
    out = _head(manifest, SCHEMA_VERSION)
    out["volumes"] = [_volume_to_dict(v) for v in manifest.volumes]
    if manifest.kind == "cellpainting":
        out["fields"] = [field_row(f) for f in manifest.fields]
    return out


def to_header(manifest: Manifest, table: TableInfo) -> dict[str, Any]:
    """The columnar form's header: everything but the items, and the table that holds them."""
    out = _head(manifest, TABLE_SCHEMA_VERSION)
    out["table"] = table.as_dict()
    return out


def _head(manifest: Manifest, version: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "schema_version": version,
        "kind": manifest.kind,
        "header": asdict(manifest.header),
        "classes": list(manifest.classes),
        "rejected": [asdict(r) for r in manifest.rejected],
    }
    if manifest.concepts:
        out["concepts"] = [asdict(c) for c in manifest.concepts]
    return out


def item_rows(manifest: Manifest) -> Iterator[dict[str, Any]]:
    """The manifest's items as the JSON form's dicts, one at a time (the table's rows)."""
    if manifest.kind == "cellpainting":
        return (field_row(f) for f in manifest.fields)
    return (_volume_to_dict(v) for v in manifest.volumes)


def field_row(f: Field) -> dict[str, Any]:
    """A field as the JSON form's dict (and the item table's row)."""
    d = asdict(f)
    for key in ("shape", "channels"):
        d[key] = list(d[key])
    for key in ("sources", "illum", "normalization"):
        d[key] = [dict(x) for x in d[key]]
    if d.get("pack_index") is None:  # a per-field item: no key, as manifests before packs
        d.pop("pack_index", None)
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


def from_dict(
    data: dict[str, Any], source: str = "<manifest>", table: Path | bytes | None = None
) -> Manifest:
    """Build a Manifest from its JSON form, or from the columnar form's header and its ``table``
    (the Parquet file, or its bytes); any mismatch raises ManifestError naming ``source``."""
    version = data.get("schema_version") if isinstance(data, dict) else None
    columnar_form = isinstance(data, dict) and "table" in data
    if version != (TABLE_SCHEMA_VERSION if columnar_form else SCHEMA_VERSION):
        raise ManifestError(
            f"{source}: manifest schema version {version!r}"
            f"{' with an item table' if columnar_form else ''}, this code reads "
            f"{SCHEMA_VERSION} (JSON) and {TABLE_SCHEMA_VERSION} (header and item table); "
            "rebuild the cache with this version of octstage"
        )
    if columnar_form and table is None:
        raise ManifestError(f"{source}: a manifest header without its item table")
    refuse_types(data, source)  # every value's type and key, before anything reads them
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
        volumes: Sequence[Volume]
        fields: Sequence[Field]
        if columnar_form:
            assert table is not None
            volumes, fields = _items(data, kind, source, table)
        else:
            volumes = tuple(_volume_from_dict(v) for v in data["volumes"])
            fields = tuple(_field_from_dict(f) for f in data.get("fields", ()))
        rejected = tuple(Rejected(**r) for r in data["rejected"])
        classes = tuple(str(c) for c in data["classes"])
        concepts = tuple(Concept(**c) for c in data.get("concepts", ()))
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"{source}: malformed manifest: {exc!r}") from exc
    return Manifest(header, classes, volumes, rejected, concepts=concepts, kind=kind, fields=fields)


def _items(
    data: dict[str, Any], kind: str, source: str, table: Path | bytes
) -> tuple[Sequence[Volume], Sequence[Field]]:
    """The table's items as a lazy ``ItemTable``: fields (Cell Painting) or volumes (OCT)."""
    info = data["table"]
    if not isinstance(info, dict) or info.get("format") != TABLE_FORMAT:
        raise ManifestError(f"{source}: table {info!r} is not a {TABLE_FORMAT} item table")
    where = f"{source}: {info.get('path')}"
    arrow = read_items(table, kind, where, info)  # the columns' types, from the footer
    name = "item_id" if kind == "cellpainting" else "zarr_path"
    nulls = table_problems(table, kind, name, str(info.get("path")))
    if nulls:
        raise ManifestTypeError(refusal(where, nulls), nulls)
    if kind == "cellpainting":
        return (), ItemTable(arrow, _field_row)
    return ItemTable(arrow, _volume_row), ()


def _field_row(d: dict[str, Any]) -> Field:
    return _field_from_dict(json_row(d))


def _volume_row(d: dict[str, Any]) -> Volume:
    return _volume_from_dict(json_row(d))


def _volume_from_dict(d: dict[str, Any]) -> Volume:
    d = dict(d)
    d["normalization"] = Normalization(**d["normalization"])
    for key in ("source_shape", "spacing_mm", "shape"):
        d[key] = tuple(d[key])
    d["clinical"] = {str(k): float(x) for k, x in d.get("clinical", {}).items()}
    _intensity_from_dict(d)
    return Volume(**d)


def load(path: str | os.PathLike[str]) -> Manifest:
    """Read and check a manifest file from local disk (no remote calls, no listing): the JSON
    form, or the columnar form's header and the item table it names beside it."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ManifestError(f"{p}: cannot read manifest: {exc.strerror or exc}") from exc
    data = parse(text, str(p))  # a key given twice is kept for ``from_dict`` to name
    table = None
    if isinstance(data, dict) and "table" in data:
        table = p.parent / table_file_name(data["table"], str(p))
    return from_dict(data, source=str(p), table=table)


def table_file_name(info: Any, source: str) -> str:
    """The item table's file name from a header's ``table``: a plain ``*.items.parquet`` name
    beside the header, nothing else (what ``write`` names it and ``stage`` may copy)."""
    name = info.get("path") if isinstance(info, dict) else None
    if (
        not isinstance(name, str)
        or not name.endswith(ITEMS_SUFFIX)
        or "/" in name
        or "\\" in name
        or name.startswith(".")
    ):
        raise ManifestError(f"{source}: table path {name!r} is not a file name beside the header")
    return name


Rows = Callable[[], Iterable[dict[str, Any]]]


def write(
    manifest: Manifest, path: str | os.PathLike[str], form: str = "json", rows: Rows | None = None
) -> None:
    """Write atomically: a reader sees the old file or the complete new one, never a part.
    ``form`` "table": the items go first into ``<stem>.items.parquet`` beside ``path`` (one row
    group at a time), then the header naming it, last. ``rows``: the items as the JSON form's
    dicts, streamed (a build's spool) instead of ``manifest``'s; either form is then written a
    row at a time, never as one document in memory."""
    p = Path(path)
    if form not in FORMS:
        raise ManifestError(f"manifest form {form!r} is not one of {', '.join(FORMS)}")
    items = rows or (lambda: item_rows(manifest))
    if form == "json":
        partial = p.with_name(f".{p.name}.partial")
        try:
            with open(partial, "w", encoding="utf-8") as f:
                for text in _json_text(manifest, items()):
                    f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, p)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        # The columnar form's table of an earlier manifest at this path is nobody's now: left
        # beside the new JSON manifest it would read as part of the cache (stage copies it).
        p.with_name(items_name(p)).unlink(missing_ok=True)
        return
    info = write_items(p.with_name(items_name(p)), manifest.kind, items())
    atomic_write_text(p, json.dumps(to_header(manifest, info), indent=1, sort_keys=False) + "\n")


def _json_text(manifest: Manifest, rows: Iterable[dict[str, Any]]) -> Iterator[str]:
    """``json.dumps(to_dict(manifest), indent=1)`` and a newline, piece by piece, the items
    taken from ``rows``: the same text, the items' list cut out of the dump and filled in."""
    key = "fields" if manifest.kind == "cellpainting" else "volumes"
    head = _head(manifest, SCHEMA_VERSION)
    head["volumes"] = []
    head[key] = [_MARK]
    # The dump is '..."<key>": [\n  "<mark>"\n ]\n}': an item is nested two levels deep.
    before, found, after = json.dumps(head, indent=1).partition("  " + json.dumps(_MARK))
    assert found, "the items' mark is in the dump"
    empty = True
    for row in rows:
        yield before if empty else ",\n"
        yield "  " + json.dumps(row, indent=1).replace("\n", "\n  ")
        empty = False
    yield (before[: -len("\n")] + "]" + after[len("\n ]") :] if empty else after) + "\n"


_MARK = "@@octstage manifest items@@"


def header_bytes(
    manifest: Manifest, form: str, put: Callable[[str, Path], None], rows: Rows | None = None
) -> bytes:
    """The manifest file's bytes in ``form`` for a cache in a bucket; the table (form "table")
    is built in a local temporary folder and handed to ``put(name, path)`` before."""
    items = rows or (lambda: item_rows(manifest))
    if form == "json":
        return "".join(_json_text(manifest, items())).encode()
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / items_name(Path("manifest.json"))
        info = write_items(local, manifest.kind, items())
        put(info.path, local)
    return (json.dumps(to_header(manifest, info), indent=1) + "\n").encode()
