"""Repeated values of an item table found by hashes (``octstage.manifest.repeats``), and the
check's exact comparison of the candidates they give."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from octstage import manifest as mf
from octstage.manifest import repeats
from octstage.manifest.columnar import SOURCE_PATHS
from octstage.manifest.itemtable import COMMON
from tests.octstage.test_manifest_cellpainting import make_cp_manifest, make_field


def _strings(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct strings of 0-40 characters, multi-byte ones among them."""
    rng = random.Random(seed)
    out: set[str] = set()
    while len(out) < n:
        out.add("".join(rng.choice("ab/é0") for _ in range(rng.randrange(0, 41))))
    return sorted(out)


@pytest.mark.parametrize("type_", [pa.string(), pa.large_string(), pa.binary()])
def test_a_value_hashes_alike_wherever_it_lies_and_distinct_values_do_not(
    type_: pa.DataType,
) -> None:
    values = _strings(3000)
    hashes = repeats.string_hashes(pa.array(values, type_))
    assert len(set(hashes.tolist())) == len(values)
    # The same values after others of every length (every alignment of their bytes), each
    # followed by different bytes, and inside a slice of a longer array.
    for shift in range(1, 9):
        moved = pa.array(["x" * shift, *values, "y" * shift], type_).slice(1, len(values))
        assert (repeats.string_hashes(moved) == hashes).all(), shift
    tails = pa.array([v + t for v in values[:50] for t in ("", "Q", "R")], type_)
    tail_hashes = repeats.string_hashes(tails).reshape(-1, 3)
    assert (tail_hashes[:, 0] == hashes[:50]).all()
    assert len(set(tail_hashes.ravel().tolist())) == 150


def test_repeated_marks_every_element_whose_hash_repeats() -> None:
    values = pa.array(["a", "b", "a", None, "c", None, "b"])
    mask = repeats.repeated(repeats.string_hashes(values))
    assert mask.tolist() == [True, True, True, True, False, True, True]
    assert not repeats.repeated(repeats.string_hashes(pa.array(_strings(500)))).any()
    # A null slot may hold bytes (Arrow leaves them undefined): two nulls still repeat.
    data = pa.py_buffer(b"abcd")
    offsets = pa.py_buffer(np.array([0, 2, 4], np.int32).tobytes())
    valid = pa.py_buffer(np.packbits([0, 0], bitorder="little").tobytes())
    nulls = pa.StringArray.from_buffers(2, offsets, data, valid, null_count=2)
    assert repeats.repeated(repeats.string_hashes(nulls)).all()


def test_lists_are_hashed_with_their_rows_and_counts() -> None:
    lists = pa.array([["a", "b"], [], None, ["b"]])
    listed = repeats.hash_lists([lists.slice(0, 2), lists.slice(2)])
    assert listed.lengths.tolist() == [2, 0, -1, 1]
    assert listed.rows_of(np.arange(3)).tolist() == [0, 0, 3]
    assert (listed.hashes == repeats.string_hashes(pa.array(["a", "b", "b"]))).all()


def _colliding(values: pa.Array) -> np.ndarray:
    return np.zeros(len(values), np.uint64)  # every value's hash the same


def test_a_collision_of_hashes_alone_is_no_finding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every path, key and id of the table hashes alike: the check compares the candidates'
    # values, so only the real repeat (the last field's sources are the first's) is found,
    # as the JSON form finds it.
    fields = [make_field(well=f"B{i:02d}", site=i) for i in range(1, 6)]
    fields.append(dataclasses.replace(make_field(well="C01", site=9), sources=fields[0].sources))
    m = make_cp_manifest(tuple(fields))
    mf.write(m, tmp_path / "manifest.json", form="table")
    monkeypatch.setattr(repeats, "string_hashes", _colliding)
    found = mf.check(mf.load(tmp_path / "manifest.json"), "cellpainting")
    assert found == mf.check(m, "cellpainting")
    assert [f.check for f in found] == ["shared-source"] * 5, found


def test_the_check_streams_the_source_paths_and_keeps_only_a_trainer_s_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A million fields name five million source files: the check reads their paths a row
    # group at a time, never whole, and keeps no column a trainer does not read next.
    fields = tuple(make_field(well=f"B{i:02d}", site=i) for i in range(1, 6))
    path = tmp_path / "manifest.json"
    mf.write(make_cp_manifest(fields), path, form="table")
    loaded = mf.load(path)
    assert isinstance(loaded.fields, mf.ItemTable)
    columns = loaded.fields._columns
    read_whole: list[str] = []
    get = columns.get

    def whole(name: str, keep: bool = True) -> pa.ChunkedArray:
        read_whole.append(name)
        return get(name, keep)

    monkeypatch.setattr(columns, "get", whole)
    assert mf.check(loaded, "cellpainting") == []
    assert SOURCE_PATHS not in read_whole and "sources" not in read_whole, read_whole
    assert set(columns.kept) <= set(COMMON) and not columns.scratch, columns.kept
