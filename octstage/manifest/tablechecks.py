"""Which rows of an item table ``checks`` must look at, found in Arrow and numpy.

``checks`` holds every rule of a manifest, row by row in Python: at a million fields that loop
alone takes longer than a trainer may wait. For the columnar form it runs only over the rows
``suspect_rows`` returns: a superset of those a per-row rule can refuse (a shape that is not 3
positive sizes, a dtype other than uint8, a field whose shape, channels and sources disagree, a
field path outside its plate's folder, a label outside the classes or not its perturbation's
class). The rules' words stay in ``checks``; a row found here and passed there is no finding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from octstage.manifest.columnar import SOURCE_PATHS
from octstage.manifest.itemtable import ItemTable, shape_array


def suspect_rows(
    items: ItemTable[Any],
    kind: str,
    classes: tuple[str, ...],
    source_counts: Callable[[], np.ndarray | None] = lambda: None,
) -> list[int]:
    """Row numbers of ``items`` that a per-row rule of ``checks`` may refuse, in order.
    ``source_counts``: each field's count of source files (-1: none listed), asked for last
    (the caller may still be reading them: ``repeats.hash_lists``); None: read here."""
    shapes, three = padded_shapes(items)
    bad = ~three | (three & (shapes.min(axis=1) < 1))
    bad |= _mask(pc.not_equal(items.column_array("dtype", keep=False), "uint8"))
    if kind == "cellpainting":
        channels = _lengths(items, "channels")
        bad |= three & (shapes[:, 0] != channels)
        bad |= _outside_plate(items)
        bad |= _label_suspects(items, classes)
        sources = source_counts()
        bad |= (_lengths(items, SOURCE_PATHS) if sources is None else sources) != channels
    return [int(n) for n in np.flatnonzero(bad)]


def padded_shapes(items: ItemTable[Any]) -> tuple[np.ndarray, np.ndarray]:
    """``(shapes, three)``: ``[n, 3]`` sizes (zeros where a shape has not 3) and which have 3."""
    column = items.column_array("shape").combine_chunks()
    three = _mask(pc.equal(pc.list_value_length(column), 3), default=False)
    if three.all():  # the usual case: no row to leave out
        return shape_array(column), three
    shapes = np.zeros((len(column), 3), dtype=np.int64)
    shapes[three] = shape_array(column.filter(pa.array(three)))
    return shapes, three


def first_shapes(items: ItemTable[Any]) -> dict[tuple[int, ...], int]:
    """Each 3-size shape and the first row that has it (rows of other shapes are suspects)."""
    shapes, three = padded_shapes(items)
    rows = np.flatnonzero(three)
    if not len(rows):
        return {}
    listed = shapes[rows]
    if (listed == listed[0]).all():  # the usual case: one shape (np.unique sorts every row)
        return {tuple(int(x) for x in listed[0]): int(rows[0])}
    unique, first = np.unique(listed, axis=0, return_index=True)
    return {tuple(int(x) for x in s): int(rows[i]) for s, i in zip(unique, first, strict=True)}


def plate_splits(items: ItemTable[Any]) -> dict[str, set[str]]:
    """The plates listed in more than one split, with their splits."""
    plate, split = items.column_array("plate", False), items.column_array("split")
    table = pa.table({"plate": plate, "split": split})
    grouped = table.group_by("plate").aggregate([("split", "distinct")]).to_pylist()
    return {g["plate"]: set(g["split_distinct"]) for g in grouped if len(g["split_distinct"]) > 1}


def _mask(values: Any, default: bool = True) -> np.ndarray:
    """A boolean Arrow array (nulls: ``default``) as numpy."""
    return np.asarray(pc.fill_null(values, default).to_numpy(zero_copy_only=False), dtype=bool)


def _lengths(items: ItemTable[Any], name: str) -> np.ndarray:
    # Streamed: only the lengths are kept (a list of dictionaries, for channels).
    parts = [
        np.asarray(pc.fill_null(pc.list_value_length(c), -1).to_numpy(), dtype=np.int64)
        for c in items.chunks(name)
    ]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _outside_plate(items: ItemTable[Any]) -> np.ndarray:
    """Fields whose ``zarr_path`` is not ``fields/<its plate>/...`` or ``packs/<its plate>/...``:
    the segment after ``fields/`` (``packs/``) up to the next ``/`` (no match: null, a suspect)
    differs from the plate."""
    path = items.column_array("zarr_path")  # kept: a trainer reads it next (COMMON)
    plate = pc.struct_field(pc.extract_regex(path, r"^(?:fields|packs)/(?P<plate>[^/]*)/"), "plate")
    return _mask(pc.not_equal(plate, items.column_array("plate", keep=False)))


def _label_suspects(items: ItemTable[Any], classes: tuple[str, ...]) -> np.ndarray:
    """Labelled fields whose label is not the index of their perturbation in ``classes``."""
    label = items.column_array("label").combine_chunks()
    known = pc.index_in(
        items.column_array("perturbation", keep=False), value_set=pa.array(classes, pa.string())
    )
    differs = pc.not_equal(pc.cast(known, pa.int64()), label)
    # A null label is no finding; a perturbation outside classes (null index) is a suspect.
    suspect: np.ndarray = _mask(label.is_valid(), default=False) & _mask(differs, default=True)
    return suspect
