"""A manifest's items as a Parquet table: the columnar form, for caches of a million items.

The JSON form holds every item in one document: ~2.4 KB of JSON and ~13 KB of Python objects
per Cell Painting field, parsed whole before the first step and copied into every loader worker
that touches the objects (reference counts write to their pages). The columnar form keeps the
small things (kind, classes, provenance, rejected sources) in the JSON header and the items in a
Parquet file beside it (``ITEMS_SUFFIX``), one row per item, columns typed per kind
(``ARROW_SCHEMAS``): the common part (``item_id``/ids, ``split``, ``label``, ``zarr_path``,
``shape``, ``dtype``, ``checksum``, ``cache_key``, sources) plus the kind's own columns.

``write_items`` streams items into row groups (``ROWS_PER_GROUP`` at a time: never the whole
list as dicts); the header, which names the table with its row count, size and SHA-256, is
written after it, so a reader that finds a header finds a complete table. ``ItemTable`` is what
a loaded manifest's ``fields`` (or ``volumes``) is: a read-only ``Sequence`` over the Arrow
columns that builds one item's dataclass when it is asked for, so a trainer and its forked loader
workers share the table's buffers (no per-item Python objects to copy on write).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from octstage.errors import ManifestError
from octstage.outputs import ITEMS_SUFFIX  # manifest.json -> manifest.items.parquet

ROWS_PER_GROUP = 16384  # rows per Parquet row group: what a writer holds as dicts at once
FORMAT = "parquet"

_NORM = pa.struct([(k, pa.float64()) for k in ("p_low", "p_high", "low", "high")])
_INTENSITY = pa.struct([("mean", pa.list_(pa.float64())), ("std", pa.list_(pa.float64()))])
_SOURCE = pa.struct(
    [("channel", pa.string()), ("path", pa.string()), ("sha1", pa.string()), ("size", pa.int64())]
)
_SHAPE = pa.list_(pa.int64())
# One typed schema per kind; the column names are the JSON form's keys (one vocabulary).
ARROW_SCHEMAS: dict[str, pa.Schema] = {
    "cellpainting": pa.schema(
        [
            ("item_id", pa.string()),
            ("split", pa.string()),
            ("label", pa.int64()),
            ("zarr_path", pa.string()),
            ("shape", _SHAPE),
            ("dtype", pa.string()),
            ("checksum", pa.string()),
            ("cache_key", pa.string()),
            ("sources", pa.list_(_SOURCE)),
            ("source", pa.string()),
            ("batch", pa.string()),
            ("plate", pa.string()),
            ("well", pa.string()),
            ("site", pa.int64()),
            ("channels", pa.list_(pa.string())),
            ("perturbation", pa.string()),
            ("perturbation_type", pa.string()),
            ("is_control", pa.bool_()),
            ("normalization", pa.list_(_NORM)),
            ("illum", pa.list_(_SOURCE)),
            ("source_dtype", pa.string()),
            ("intensity", _INTENSITY),
        ]
    ),
    "oct": pa.schema(
        [
            ("participant_id", pa.string()),
            ("device", pa.string()),
            ("laterality", pa.string()),
            ("protocol", pa.string()),
            ("split", pa.string()),
            ("study_group", pa.string()),
            ("label", pa.int64()),
            ("source_path", pa.string()),
            ("source_sha1", pa.string()),
            ("source_size", pa.int64()),
            ("transfer_syntax", pa.string()),
            ("source_shape", _SHAPE),
            ("spacing_mm", pa.list_(pa.float64())),
            ("zarr_path", pa.string()),
            ("shape", _SHAPE),
            ("dtype", pa.string()),
            ("normalization", _NORM),
            ("checksum", pa.string()),
            ("cache_key", pa.string()),
            ("device_model", pa.string()),
            ("anatomic_region", pa.string()),
            ("scan_size", pa.string()),
            ("clinical", pa.map_(pa.string(), pa.float64())),
            ("intensity", _INTENSITY),
        ]
    ),
}
# Columns with few distinct values: read as Arrow dictionaries (one copy of each string).
_DICTIONARY = ("split", "dtype", "source", "batch", "plate", "perturbation_type", "source_dtype")

T = TypeVar("T")


@dataclass(frozen=True)
class TableInfo:
    """What the header says of its table: file name (beside the header), rows, bytes, hash."""

    path: str
    rows: int
    bytes: int
    sha256: str

    def as_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, **self.__dict__}


def items_name(header: Path) -> str:
    """The table's file name for a header file: ``manifest.json`` -> ``manifest.items.parquet``."""
    return Path(header.name).stem + ITEMS_SUFFIX


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def write_items(
    path: Path, kind: str, rows: Iterable[dict[str, Any]], rows_per_group: int = ROWS_PER_GROUP
) -> TableInfo:
    """Stream ``rows`` (the JSON form's item dicts) into the Parquet table at ``path``, one row
    group at a time, atomically (a ``.partial`` file renamed once closed)."""
    schema = ARROW_SCHEMAS[kind]
    partial = path.with_name(f".{path.name}.partial")
    count = 0
    try:
        with pq.ParquetWriter(partial, schema, compression="zstd") as writer:
            batch: list[dict[str, Any]] = []
            for row in rows:
                batch.append(row)
                if len(batch) >= rows_per_group:
                    writer.write_batch(pa.RecordBatch.from_pylist(batch, schema=schema))
                    count, batch = count + len(batch), []
            if batch or not count:
                writer.write_batch(pa.RecordBatch.from_pylist(batch, schema=schema))
                count += len(batch)
        with open(partial, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return TableInfo(path.name, count, path.stat().st_size, file_sha256(path))


def read_items(source: Path | bytes, kind: str, where: str, info: dict[str, Any]) -> pa.Table:
    """The table a header names (a file, memory-mapped, or its bytes), checked against the header
    (row count, size) and the kind's schema; a mismatch is a ManifestError naming ``where``."""
    try:
        size = len(source) if isinstance(source, bytes) else source.stat().st_size
        # The size first: a table of another build, or a partial copy, is named as such.
        if size != info.get("bytes"):
            raise ManifestError(
                f"{where}: the item table is {size} bytes, the header says {info.get('bytes')} "
                "(a table of another build, or a partial copy): rebuild or restage the cache"
            )
        if isinstance(source, bytes):
            table = pq.read_table(pa.BufferReader(source), read_dictionary=_dictionary(kind))
        else:
            table = pq.read_table(source, memory_map=True, read_dictionary=_dictionary(kind))
    except (OSError, pa.ArrowException) as exc:
        raise ManifestError(f"{where}: cannot read the manifest's item table: {exc}") from None
    if table.num_rows != info.get("rows"):
        raise ManifestError(
            f"{where}: the item table has {table.num_rows} rows, the header says {info.get('rows')}"
        )
    expected = ARROW_SCHEMAS[kind]
    plain = pa.schema([pa.field(f.name, _plain(f.type)) for f in table.schema])
    if not plain.equals(expected):
        raise ManifestError(
            f"{where}: item table columns {plain.names} differ from a {kind!r} manifest's "
            f"({expected.names}) or their types: upgrade octstage or rebuild the cache"
        )
    return table


def _dictionary(kind: str) -> list[str]:
    return [c for c in _DICTIONARY if c in ARROW_SCHEMAS[kind].names]


def _plain(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def json_row(row: dict[str, Any]) -> dict[str, Any]:
    """A table row as the JSON form's item dict: an unmeasured ``intensity`` (null) is absent,
    the ``clinical`` map (read as key-value pairs) an object."""
    if row.get("intensity") is None:
        row.pop("intensity", None)
    if "clinical" in row:
        row["clinical"] = dict(row["clinical"] or ())
    return row


class ItemTable(Sequence[T], Generic[T]):
    """A read-only sequence of a manifest's items over an Arrow table: ``table[i]`` builds the
    item's dataclass (``convert`` of the row's dict) when asked; slices and ``where`` are views.
    ``column`` gives one column's values without building any item."""

    def __init__(
        self,
        table: pa.Table,
        convert: Callable[[dict[str, Any]], T],
        index: pa.Array | None = None,
    ) -> None:
        self._table = table
        self._convert = convert
        # Row numbers of the view (None: every row, in order); an Arrow array, not a Python list.
        self._index = index

    @property
    def table(self) -> pa.Table:
        """The rows of this view as an Arrow table."""
        return self._table if self._index is None else self._table.take(self._index)

    def __len__(self) -> int:
        return self._table.num_rows if self._index is None else len(self._index)

    def _row(self, n: int) -> int:
        return n if self._index is None else int(self._index[n].as_py())

    @overload
    def __getitem__(self, key: int) -> T: ...
    @overload
    def __getitem__(self, key: slice) -> ItemTable[T]: ...
    def __getitem__(self, key: int | slice) -> T | ItemTable[T]:
        if isinstance(key, slice):
            rows = range(len(self))[key]
            index = (
                pa.array(rows, pa.int64())
                if self._index is None
                else self._index.take(pa.array(rows, pa.int64()))
            )
            return ItemTable(self._table, self._convert, index)
        n = len(self)
        if not -n <= key < n:
            raise IndexError(f"item {key} of {n}")
        row = self._table.slice(self._row(key % n), 1).to_pylist()[0]
        return self._convert(row)

    def __iter__(self) -> Iterator[T]:
        for batch in self.table.to_batches(max_chunksize=4096):
            for row in batch.to_pylist():
                yield self._convert(row)

    def json_rows(self) -> Iterator[dict[str, Any]]:
        """The rows as the JSON form's item dicts (what the JSON Schema's $defs describe)."""
        for batch in self.table.to_batches(max_chunksize=4096):
            for row in batch.to_pylist():
                yield json_row(row)

    def column(self, name: str) -> list[Any]:
        """One column's values, in order (Python values; no item is built)."""
        values: list[Any] = self.column_array(name).to_pylist()
        return values

    def column_array(self, name: str) -> pa.ChunkedArray:
        """One column as Arrow (dictionary columns decoded)."""
        col = self._table.column(name)
        if self._index is not None:
            col = col.take(self._index)
        return col.cast(_plain(col.type)) if pa.types.is_dictionary(col.type) else col

    def where(self, name: str, value: object) -> ItemTable[T]:
        """The view of the items whose column ``name`` equals ``value``, in order."""
        mask = pc.equal(self.column_array(name), pa.scalar(value))
        rows = pc.indices_nonzero(pc.fill_null(mask, False))
        index = rows if self._index is None else self._index.take(rows)
        return ItemTable(self._table, self._convert, index)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # mutable-equality container, like a list

    def __repr__(self) -> str:
        return f"ItemTable({len(self)} rows)"
