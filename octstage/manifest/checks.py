"""The one check of a manifest (``check``), per kind, and ``refuse``: which findings stop which
consumer before its work (``FATAL``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from octstage.manifest.columnar import SOURCE_PATHS
from octstage.manifest.itemtable import ItemTable
from octstage.manifest.model import (
    Field,
    Item,
    Manifest,
)
from octstage.manifest.repeats import ListedStrings, hash_lists, hash_strings, mix, repeated
from octstage.manifest.tablechecks import first_shapes, plate_splits, suspect_rows

# What ``check`` looks for, by name: the consumers differ only in which of these are fatal.
CHECKS = ("kind", "empty", "duplicate", "split", "label", "shape", "shared-source")
# Which findings stop each consumer before any work (the rest are warnings); see ``refuse``.
# pretrain reads no labels, and an item in two splits only biases its validation figures (a
# warning); profile scores every field whatever its split. The rest stop on every finding.
# ``octtrain doctor`` applies the set of the job its config launches (pretrain or finetune).
# Where a field's ``zarr_path`` may be: alone (``fields/<plate>/``) or packed (``packs/<plate>/``).
FIELD_TOPS = ("fields", "packs")
FATAL: dict[str, frozenset[str]] = {
    **{c: frozenset(CHECKS) for c in ("verify", "stage", "finetune", "evaluate")},
    "probe": frozenset(CHECKS),
    "pretrain": frozenset(CHECKS) - {"label", "split"},
    "profile": frozenset(CHECKS) - {"split"},
    # An export carries each item's split and label into its tables: a contradiction there
    # would be exported as a fact.
    "embed": frozenset(CHECKS),
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
    one array's data), a field stored under another plate's folder. Types come first: a loaded
    manifest's values were held against the schema's as it loaded (``itemtypes``: a value of
    another type, a key missing or given twice, does not load), so every rule here compares
    values of their types.
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
    try:
        # Of an item table of fields, the sources' paths are read and hashed on a second core
        # meanwhile (``_listed_sources``); of an item table, the per-row rules run over the
        # rows Arrow finds suspect (``_rows``).
        with ThreadPoolExecutor(1) as pool:
            if manifest.kind == "cellpainting":
                field_findings, rows = _field_findings(manifest, _listed_sources(pool, items))
                found += field_findings
            else:
                rows = _rows(manifest, _no_sources)
                found += _volume_findings(manifest)
        found += _shape_findings(manifest, what, rows)
    finally:
        if isinstance(items, ItemTable):
            items.release()  # the columns the check read: not the trainer's to keep
    return found


def _shape_findings(manifest: Manifest, what: str, rows: Sequence[int]) -> list[Finding]:
    """Shapes that are not 3 positive sizes of uint8 (of ``rows``), and items of more than one
    shape."""
    found: list[Finding] = []
    items = manifest.items
    shapes = first_shapes(items) if isinstance(items, ItemTable) else {}
    paths = _values(items, "zarr_path", rows)
    for k, (shape, dtype) in enumerate(
        zip(_values(items, "shape", rows), _values(items, "dtype", rows), strict=True)
    ):
        n, shape = rows[k], tuple(shape)
        shapes.setdefault(shape, n)
        if len(shape) != 3 or min(shape, default=0) < 1 or dtype != "uint8":
            found.append(
                Finding(
                    "shape",
                    f"{what}[{n}] ({paths[k]}): shape {list(shape)} dtype "
                    f"{dtype}, expected 3 positive sizes of uint8",
                )
            )
    shapes = dict(sorted(shapes.items(), key=lambda kv: kv[1]))  # in order of first listing
    if len(shapes) > 1:
        listed = ", ".join(f"{list(s)} at {what}[{n}]" for s, n in list(shapes.items())[:4])
        found.append(Finding("shape", f"{what} of {len(shapes)} shapes: {listed}"))
    return found


def _rows(manifest: Manifest, sources: Callable[[], ListedStrings | None]) -> Sequence[int]:
    """The rows the per-row rules look at: every row, or an item table's suspects (of its
    fields, the sources' counts asked for last)."""
    items = manifest.items
    if not isinstance(items, ItemTable):
        return range(len(items))

    def counts() -> np.ndarray | None:
        listed = sources()
        return None if listed is None else listed.lengths

    return suspect_rows(items, manifest.kind, manifest.classes, counts)


def _no_sources() -> ListedStrings | None:
    return None


def _listed_sources(
    pool: ThreadPoolExecutor, items: Sequence[Item]
) -> Callable[[], ListedStrings | None]:
    """An item table's source paths hashed (``repeats``), when asked for: read and hashed on
    a second core while the other rules run (Arrow and numpy release the GIL; a million
    fields' five million paths take about as long as every other rule). None for a list."""
    if isinstance(items, ItemTable):
        return pool.submit(hash_lists, items.chunks(SOURCE_PATHS), "path").result
    return _no_sources


def _values(items: Sequence[Item], name: str, rows: Sequence[int] | None = None) -> list[Any]:
    """One attribute of every item (or of ``rows``), in order; of an item table, its column
    (no item built)."""
    if isinstance(items, ItemTable):
        if rows is not None and not len(rows):  # a view of no rows would read the column
            return []
        return (items if rows is None else items.take(rows)).column(name, keep=False)
    values = [getattr(item, name) for item in items]
    return values if rows is None or isinstance(rows, range) else [values[n] for n in rows]


def _maybe_repeated(items: Sequence[Item], name: str) -> Sequence[int]:
    """The rows whose ``name`` may be listed twice: of an item table, those whose value's hash
    repeats (``repeats``: no Python string per row); of a list of items, every row."""
    if not isinstance(items, ItemTable):
        return range(len(items))
    rows = np.flatnonzero(repeated(hash_strings(items.chunks(name))))
    return [int(n) for n in rows]


def _duplicates(items: Sequence[Item], what: str, keys: tuple[str, ...]) -> list[Finding]:
    found = []
    for key in keys:
        rows = _maybe_repeated(items, key)
        if not rows:
            continue
        seen: dict[object, int] = {}
        for n, value in zip(rows, _values(items, key, rows), strict=True):
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


def _duplicate_addresses(items: Sequence[Item]) -> list[Finding]:
    """Two fields at one address: the same ``zarr_path`` (the per-field form), or the same
    place (``pack_index``) in one pack: they would read the same values."""
    rows: Sequence[int] = range(len(items))
    if isinstance(items, ItemTable):
        index = items.column_array("pack_index", keep=False)
        if index.null_count == len(index):  # no packed field: the path alone, as before
            return _duplicates(items, "fields", ("zarr_path",))
        # Hashed as the other repeat checks (a pack's path repeats by design: every member
        # names it), the place mixed in; only rows whose address hash repeats are compared.
        places = np.array(pc.fill_null(index, -1).to_numpy(), dtype=np.int64)  # mixed in place
        hashes = hash_strings(items.chunks("zarr_path")) ^ mix(places.view(np.uint64))
        rows = [int(n) for n in np.flatnonzero(repeated(hashes))]
        if not rows:
            return []
        view = items.take(rows)
        paths, slots = view.column("zarr_path", keep=False), view.column("pack_index", keep=False)
        values = [f"{p}#{'' if s is None else s}" for p, s in zip(paths, slots, strict=True)]
    else:
        values = [f"{f.zarr_path}#{_pack_index(f)}" for f in items]
    found: list[Finding] = []
    seen: dict[str, int] = {}
    for n, value in zip(rows, values, strict=True):
        if value in seen:
            path, _, slot = value.partition("#")
            what = f"zarr_path {path!r}" + (f" pack_index {slot}" if slot else "")
            found.append(
                Finding("duplicate", f"fields[{n}]: {what} already listed at fields[{seen[value]}]")
            )
        else:
            seen[value] = n
    return found


def _pack_index(item: Item) -> str:
    index = getattr(item, "pack_index", None)
    return "" if index is None else str(index)


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


def _lengths(items: Sequence[Item], name: str, rows: Sequence[int]) -> list[int]:
    """How many values a list attribute (``channels``) holds, per item of ``rows``."""
    if isinstance(items, ItemTable):
        if not rows:  # a view of no rows would still read the whole column
            return []
        column = items.take(rows).column_array(name, False)
        return pc.list_value_length(column).to_pylist()  # type: ignore[no-any-return]
    return [len(value) for value in _values(items, name, rows)]


def _source_pairs(
    items: Sequence[Field], sources: ListedStrings | None
) -> tuple[list[tuple[int, str]], dict[int, str]]:
    """``(row, path)`` of every source file that may be another row's too, in the rows' order,
    and those rows' ids. Of an item table (``sources`` hashed): only the paths whose hash
    repeats, read again only when there are any; of a list of items, every path."""
    if sources is None:
        pairs = [(n, s.path) for n, item in enumerate(items) for s in item.sources]
        return pairs, {n: item.item_id for n, item in enumerate(items)}
    assert isinstance(items, ItemTable)
    maybe = np.flatnonzero(repeated(sources.hashes))
    if not len(maybe):
        return [], {}
    flat = pc.list_flatten(items.column_array(SOURCE_PATHS, keep=False))
    paths = pc.struct_field(flat, "path").take(pa.array(maybe)).to_pylist()
    rows = [int(n) for n in sources.rows_of(maybe)]
    named = sorted(set(rows))
    ids = dict(zip(named, _values(items, "item_id", named), strict=True))
    return list(zip(rows, paths, strict=True)), ids


def _shared_sources(items: Sequence[Field], sources: ListedStrings | None) -> list[Finding]:
    """Two fields naming the same source file (they would share one array's data)."""
    found: list[Finding] = []
    pairs, ids = _source_pairs(items, sources)
    first: dict[str, int] = {}
    for n, path in pairs:
        if path in first and first[path] != n:
            found.append(
                Finding(
                    "shared-source",
                    f"fields[{n}] ({ids[n]}): source {path!r} is also "
                    f"fields[{first[path]}]'s ({ids[first[path]]})",
                )
            )
        first.setdefault(path, n)
    return found


def _field_findings(
    manifest: Manifest, listed: Callable[[], ListedStrings | None]
) -> tuple[list[Finding], Sequence[int]]:
    """The fields' findings and the rows the per-row rules looked at; the rules that need
    the sources' paths (``listed``) run last."""
    items = manifest.items
    found = _duplicates(items, "fields", ("cache_key", "item_id"))
    found += _duplicate_addresses(items)
    plates: dict[str, set[str]] = {}
    if isinstance(items, ItemTable):
        plates = plate_splits(items)
    else:
        for plate, split in zip(_values(items, "plate"), _values(items, "split"), strict=True):
            plates.setdefault(plate, set()).add(split)
    rows = _rows(manifest, listed)
    sources = listed()
    found += _shared_sources(manifest.fields, sources)
    names = ("item_id", "plate", "zarr_path", "label", "perturbation", "shape")
    values = zip(*(_values(items, name, rows) for name in names), strict=True)
    channels = _lengths(items, "channels", rows)
    if sources is None:
        n_sources = _lengths(items, "sources", rows)
    else:
        n_sources = [int(sources.lengths[n]) for n in rows]
    classes = manifest.classes
    for k, (item_id, plate, path, label, perturbation, shape) in enumerate(values):
        n = rows[k]
        parts = path.split("/")
        if len(parts) < 3 or parts[0] not in FIELD_TOPS or parts[1] != plate:
            found.append(
                Finding(
                    "shared-source",
                    f"fields[{n}] ({item_id}): of plate {plate} but stored at "
                    f"{path!r}, not under fields/{plate}/ or packs/{plate}/",
                )
            )
        if label is not None and not 0 <= label < len(classes):
            found.append(
                Finding(
                    "label",
                    f"fields[{n}] ({item_id}): label {label} outside the {len(classes)} classes",
                )
            )
        elif label is not None and classes[label] != perturbation:
            found.append(
                Finding(
                    "label",
                    f"fields[{n}] ({item_id}): label {label} is class "
                    f"{classes[label]!r}, perturbation says {perturbation!r}",
                )
            )
        if not shape or shape[0] != channels[k] or n_sources[k] != channels[k]:
            found.append(
                Finding(
                    "shape",
                    f"fields[{n}] ({item_id}): {channels[k]} channels, shape "
                    f"{list(shape)} and {n_sources[k]} source files",
                )
            )
    for plate, seen in sorted(plates.items()):
        if len(seen) > 1:
            found.append(
                Finding("split", f"plate {plate}: in {len(seen)} splits: {', '.join(sorted(seen))}")
            )
    return found, rows


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
