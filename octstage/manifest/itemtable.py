"""A loaded columnar manifest's items: ``ItemTable``, and ``CommonRows`` for a trainer.

``ItemTable`` is what a loaded columnar manifest's ``fields`` (or ``volumes``) is: a read-only
``Sequence`` over the item table's columns (``columnar.Columns``, each read when first used)
that builds one item's dataclass when asked, with ``column``/``where``/``take`` that build none.
``CommonRows`` holds the few columns a trainer reads as Arrow and numpy arrays, so a trainer and
its forked loader workers share buffers that no reference count writes to (the JSON form's
per-item objects are copied page by page into every worker that touches them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from octstage.manifest.columnar import Columns, json_row, plain_type
from octstage.manifest.model import Intensity

T = TypeVar("T")
# The columns a trainer keeps of its split (``ItemTable.common``): the check keeps the ones it
# reads, for the trainer reads them next.
COMMON = ("zarr_path", "shape", "split", "label", "intensity")


def shape_array(column: pa.Array) -> np.ndarray:
    """A ``shape`` column (lists of 3 sizes) as an ``[n, 3]`` int64 array; a row without 3
    sizes is a ValueError (the manifest's check refuses such rows before a trainer gets here)."""
    values = pc.list_flatten(column).to_numpy(zero_copy_only=False)
    if len(values) != 3 * len(column):
        raise ValueError("a shape without 3 sizes")
    return np.asarray(values, dtype=np.int64).reshape(-1, 3)


def _one_array(column: pa.ChunkedArray) -> pa.Array:
    """A column as one array: its only chunk as it is (``combine_chunks`` copies even one)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


class ItemTable(Sequence[T], Generic[T]):
    """A read-only sequence of a manifest's items over its Arrow columns: ``table[i]`` builds
    the item's dataclass (``convert`` of the row's dict) when asked; slices and ``where`` are
    views (row numbers in an Arrow array). ``column`` gives one column's values and ``common``
    the few columns a trainer reads, without building any item."""

    def __init__(
        self,
        columns: Columns,
        convert: Callable[[dict[str, Any]], T],
        index: pa.Array | None = None,
    ) -> None:
        self._columns = columns
        self._convert = convert
        self._index = index  # row numbers of the view; None: every row, in order

    @property
    def table(self) -> pa.Table:
        """The rows of this view as an Arrow table (every column read)."""
        table = self._columns.table()
        return table if self._index is None else table.take(self._index)

    @property
    def names(self) -> list[str]:
        """The table's column names (the kind's; an optional one a table predates reads null)."""
        return self._columns.names

    def __len__(self) -> int:
        return self._columns.rows if self._index is None else len(self._index)

    def _row(self, n: int) -> int:
        return n if self._index is None else int(self._index[n].as_py())

    @overload
    def __getitem__(self, key: int) -> T: ...
    @overload
    def __getitem__(self, key: slice) -> ItemTable[T]: ...
    def __getitem__(self, key: int | slice) -> T | ItemTable[T]:
        if isinstance(key, slice):
            rows = pa.array(range(len(self))[key], pa.int64())
            index = rows if self._index is None else self._index.take(rows)
            return ItemTable(self._columns, self._convert, index)
        n = len(self)
        if not -n <= key < n:
            raise IndexError(f"item {key} of {n}")
        row = self._row(key % n)
        names = self._columns.names
        return self._convert({name: self._columns.get(name)[row].as_py() for name in names})

    def batches(self, names: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
        """Every row (every column, or ``names``) in batches: of the whole table a row group
        at a time, nothing kept (a walk over a million items holds one row group); of a view,
        its rows."""
        if self._index is None:
            tables = self._columns.row_groups(names)
        else:
            table = self.table
            tables = iter([table if names is None else table.select(list(names))])
        for table in tables:
            yield from table.to_batches(max_chunksize=4096)

    def __iter__(self) -> Iterator[T]:
        for batch in self.batches():
            for row in batch.to_pylist():
                yield self._convert(row)

    def json_rows(self) -> Iterator[dict[str, Any]]:
        """The rows as the JSON form's item dicts (what the JSON Schema's $defs describe)."""
        for batch in self.batches():
            for row in batch.to_pylist():
                yield json_row(row)

    def column(self, name: str, keep: bool = True) -> list[Any]:
        """One column's values, in order (Python values; no item is built)."""
        values: list[Any] = self.column_array(name, keep).to_pylist()
        return values

    def column_array(self, name: str, keep: bool = True) -> pa.ChunkedArray:
        """One column as Arrow (dictionary columns decoded); ``keep``: cache it for reuse."""
        col = self._columns.get(name, keep)
        if self._index is not None:
            col = col.take(self._index)
        return col.cast(plain_type(col.type)) if pa.types.is_dictionary(col.type) else col

    def chunks(self, name: str) -> Iterator[pa.Array]:
        """One column in pieces (a row group each, of the whole table; one piece of a view),
        nothing kept, dictionary columns decoded: see ``Columns.chunks``."""
        if self._index is not None:
            yield self.column_array(name, keep=False).combine_chunks()
            return
        for chunk in self._columns.chunks(name):
            dictionary = pa.types.is_dictionary(chunk.type)
            yield chunk.cast(plain_type(chunk.type)) if dictionary else chunk

    def release(self, kept: bool = False) -> None:
        """Forget the columns read without ``keep`` (``kept``: every column; see
        ``Columns.release``)."""
        self._columns.release(kept)

    def take(self, rows: Sequence[int]) -> ItemTable[T]:
        """The view of the given rows (of this view), in the given order."""
        take = pa.array(rows, pa.int64())
        return ItemTable(
            self._columns, self._convert, take if self._index is None else self._index.take(take)
        )

    def where(self, name: str, value: object) -> ItemTable[T]:
        """The view of the items whose column ``name`` equals ``value``, in order."""
        mask = pc.equal(self.column_array(name), pa.scalar(value))
        rows = pc.indices_nonzero(pc.fill_null(mask, False))
        index = rows if self._index is None else self._index.take(rows)
        return ItemTable(self._columns, self._convert, index)

    def common(self) -> CommonRows:
        """The items' common part a trainer reads (path, shape, split, label, intensity and a
        packed field's ``pack_index``), as arrays; one small record is built per item when it
        is read. The table's whole columns (kept: the check has read most of them) and this
        view's row numbers: no column is copied for a split."""
        columns = [self._columns.get(name) for name in COMMON]
        path, shape, split, label, intensity = (
            _one_array(c.cast(plain_type(c.type)) if pa.types.is_dictionary(c.type) else c)
            for c in columns
        )
        pack = (
            _one_array(self._columns.get("pack_index"))
            if "pack_index" in self._columns.names  # a Cell Painting table's
            else None
        )
        rows = None if self._index is None else self._index.to_numpy()
        return CommonRows(path, shape_array(shape), split, label, intensity, rows, pack)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # mutable-equality container, like a list

    def __repr__(self) -> str:
        return f"ItemTable({len(self)} rows)"


@dataclass(frozen=True)
class CommonRecord:
    """The common part of one item that a trainer reads (see ``ItemTable.common``)."""

    zarr_path: str
    shape: tuple[int, ...]
    split: str
    label: int | None
    intensity: Intensity | None
    pack_index: int | None = None  # a packed field's place in its pack's array

    @property
    def array_path(self) -> str:
        return f"{self.zarr_path}/0"


class CommonRows(Sequence[CommonRecord]):
    """Items' common part as Arrow arrays and one numpy array of shapes, of a table's rows
    (``rows``: their numbers, None: every row in order): ``rows[i]`` builds one
    ``CommonRecord``. Nothing here is a Python object per item, so forked loader workers share
    these buffers instead of copying pages that reference counts write to."""

    def __init__(
        self,
        zarr_path: pa.Array,
        shapes: np.ndarray,
        split: pa.Array,
        label: pa.Array,
        intensity: pa.Array,
        rows: np.ndarray | None = None,
        pack_index: pa.Array | None = None,
    ) -> None:
        self.zarr_path, self.all_shapes, self.split = zarr_path, shapes, split
        self.label, self.all_intensity, self.rows = label, intensity, rows
        # None: no item is packed (no per-item null kept)
        self.pack_index = (
            pack_index if pack_index is None or pack_index.null_count < len(pack_index) else None
        )

    def __len__(self) -> int:
        return len(self.zarr_path) if self.rows is None else len(self.rows)

    @property
    def shapes(self) -> np.ndarray:
        """The ``[n, 3]`` shapes of these rows."""
        return self.all_shapes if self.rows is None else self.all_shapes[self.rows]

    @property
    def intensity(self) -> pa.Array:
        """The intensity column of these rows."""
        if self.rows is None:
            return self.all_intensity
        return self.all_intensity.take(pa.array(self.rows))

    @overload
    def __getitem__(self, key: int) -> CommonRecord: ...
    @overload
    def __getitem__(self, key: slice) -> CommonRows: ...
    def __getitem__(self, key: int | slice) -> CommonRecord | CommonRows:
        if isinstance(key, slice):
            if self.rows is None and key.indices(len(self)) == (0, len(self), 1):
                return self  # ``[:max_samples]`` of every row
            rows = np.arange(len(self)) if self.rows is None else self.rows
            return CommonRows(
                self.zarr_path,
                self.all_shapes,
                self.split,
                self.label,
                self.all_intensity,
                rows[key],
                self.pack_index,
            )
        n = len(self)
        if not -n <= key < n:
            raise IndexError(f"item {key} of {n}")
        row = key % n if self.rows is None else int(self.rows[key])
        stats = self.all_intensity[row].as_py()
        return CommonRecord(
            self.zarr_path[row].as_py(),
            tuple(int(x) for x in self.all_shapes[row]),
            self.split[row].as_py(),
            self.label[row].as_py(),
            None if stats is None else Intensity(tuple(stats["mean"]), tuple(stats["std"])),
            None if self.pack_index is None else self.pack_index[row].as_py(),
        )
