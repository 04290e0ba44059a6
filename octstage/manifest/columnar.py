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
written after it, so a reader that finds a header finds a complete table. ``read_items`` checks
a table against its header from the footer alone; ``Columns`` reads each column when first used
(``itemtable`` builds the sequence of items over them).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from octstage.errors import ManifestError, ManifestTypeError
from octstage.outputs import ITEMS_SUFFIX  # manifest.json -> manifest.items.parquet

ROWS_PER_GROUP = 16384  # rows per Parquet row group: what a writer holds as dicts at once
FORMAT = "parquet"
# The Parquet path of the sources' file paths alone: what the checks read of ``sources`` (a
# tenth of its bytes without the hashes, channels and sizes).
SOURCE_PATHS = "sources.list.element.path"

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
            ("pack_index", pa.int64()),
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
# Columns added after tables were first written: a table without one reads it as all null
# (``pack_index``: tables before packed caches, whose every field is its own array).
OPTIONAL_COLUMNS = frozenset({"pack_index"})
# Columns with few distinct values: read as Arrow dictionaries (one copy of each string).
_DICTIONARY = ("split", "dtype", "source", "batch", "plate", "perturbation_type", "source_dtype")
# Lists of a few distinct strings, read as lists of dictionaries a row group at a time (Arrow
# reads no nested dictionary whole): a million fields' channel names are 5M strings otherwise.
_DICTIONARY_LEAVES = {"channels": "channels.list.element"}


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
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def table_digest_problem(header: Path) -> str | None:
    """Of a columnar manifest's header: what is wrong when its item table's SHA-256 is not the
    one the header names (a table of the same size with other bytes: a flipped bit, another
    build's table copied over); None for the JSON form, or a table that matches. The size, the
    row count and the schema are checked on every load (``read_items``); this is the one hash,
    for the consumers that read the table's values without ``verify`` (the trainer, ``doctor``,
    ``embed``)."""
    try:
        data = json.loads(header.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the load that comes first names what is wrong with the header itself
    info = data.get("table") if isinstance(data, dict) else None
    if not isinstance(info, dict) or "sha256" not in info:
        return None
    table = header.parent / str(info.get("path"))
    try:
        digest = file_sha256(table)
    except OSError as exc:
        return f"{table}: cannot read the item table ({exc.strerror or exc})"
    if digest != info["sha256"]:
        return (
            f"{table}: the item table's SHA-256 is {digest[:16]}..., the header says "
            f"{str(info['sha256'])[:16]}... (its bytes changed after the header was written): "
            "stage the cache again (octstage stage) or rebuild it"
        )
    return None


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


class Columns:
    """An item table's columns, each read when first asked for (from the file, memory-mapped, or
    from its bytes) and kept unless asked not to: a trainer reads the few it uses, never the
    source files' paths and hashes. Views of one table share one ``Columns``."""

    def __init__(self, source: Path | bytes, kind: str, rows: int, where: str = "") -> None:
        self.source, self.kind, self.rows, self.where = source, kind, rows, where
        self.names: list[str] = ARROW_SCHEMAS[kind].names
        self.kept: dict[str, pa.ChunkedArray] = {}
        self.scratch: dict[str, pa.ChunkedArray] = {}

    @contextmanager
    def _decoding(self) -> Iterator[None]:
        """A column that does not decode (its bytes changed after the header was written: the
        footer read at load time can still be whole) is a ManifestError naming the table, not
        the codec's own words from deep in a consumer."""
        try:
            yield
        except (OSError, pa.ArrowException) as exc:
            raise ManifestError(
                f"{self.where}: the manifest's item table does not decode ({exc}): its bytes "
                "changed after it was written; stage the cache again (octstage stage) or "
                "rebuild it"
            ) from None

    def get(self, name: str, keep: bool = True) -> pa.ChunkedArray:
        """One column (a low-cardinality one as an Arrow dictionary), or one leaf of a nested
        column by its Parquet path (``SOURCE_PATHS``: a list of structs holding only it).
        Not kept (``keep`` False), it stays until ``release``: one check reads it once."""
        for cache in (self.kept, self.scratch):
            if name in cache:  # not ``or``: an empty column is falsy
                return cache[name]
        source = pa.BufferReader(self.source) if isinstance(self.source, bytes) else self.source
        dictionary = [name] if name in _DICTIONARY else None
        with self._decoding():
            reader = pq.ParquetFile(source, memory_map=True, read_dictionary=dictionary)
            if name in OPTIONAL_COLUMNS and name not in reader.schema_arrow.names:
                kind = ARROW_SCHEMAS[self.kind].field(name).type
                column = pa.chunked_array([pa.nulls(self.rows, kind)])
            else:
                column = reader.read(columns=[name]).column(0)
        (self.kept if keep else self.scratch)[name] = column
        return column

    def chunks(self, name: str) -> Iterator[pa.Array]:
        """One column (or leaf, as ``get``) one row group at a time, nothing kept (the column
        itself where it is already read): what a check streams through, where reading it whole
        would hold it all (a million fields' source paths: ~430 MB)."""
        for cache in (self.kept, self.scratch):
            if name in cache:
                yield from cache[name].chunks
                return
        source = pa.BufferReader(self.source) if isinstance(self.source, bytes) else self.source
        leaf = _DICTIONARY_LEAVES.get(name)
        with self._decoding():
            reader = pq.ParquetFile(source, memory_map=True, read_dictionary=leaf and [leaf])
        for group in range(reader.num_row_groups):
            with self._decoding():
                chunk = reader.read_row_group(group, columns=[name]).column(0).combine_chunks()
            yield chunk

    def row_groups(self, names: Sequence[str] | None = None) -> Iterator[pa.Table]:
        """Every column (or ``names``), one row group at a time, nothing kept (columns already
        kept are not read again, only sliced): a walk over every item (``verify``, a schema
        check) holds a row group, where the whole table of a million fields is ~1 GB of Arrow."""
        names = self.names if names is None else list(names)
        source = pa.BufferReader(self.source) if isinstance(self.source, bytes) else self.source
        with self._decoding():
            reader = pq.ParquetFile(source, memory_map=True)
        present = set(reader.schema_arrow.names)
        schema = ARROW_SCHEMAS[self.kind]
        start = 0
        for group in range(reader.num_row_groups):
            rows = reader.metadata.row_group(group).num_rows
            wanted = [n for n in names if n in present and n not in self.kept]
            with self._decoding():
                read = reader.read_row_group(group, columns=wanted)
            columns = []
            for name in names:
                if name in self.kept:
                    columns.append(self.kept[name].slice(start, rows))
                elif name in present:
                    columns.append(read.column(name))
                else:  # an optional column the table predates
                    columns.append(pa.chunked_array([pa.nulls(rows, schema.field(name).type)]))
            start += rows
            yield pa.table(dict(zip(names, columns, strict=True)))

    def release(self, kept: bool = False) -> None:
        """Forget the columns read without ``keep`` (a check's, not a trainer's; ``kept``: the
        kept ones too, for a consumer that is not a trainer), and hand the memory they took
        back to the system (Arrow's allocator keeps freed pages otherwise)."""
        self.scratch.clear()
        if kept:
            self.kept.clear()
        pa.default_memory_pool().release_unused()

    def table(self) -> pa.Table:
        """Every column (all read and kept)."""
        return pa.table({name: self.get(name) for name in self.names})


def read_items(source: Path | bytes, kind: str, where: str, info: dict[str, Any]) -> Columns:
    """The table a header names (a file, or its bytes), checked against the header (size, row
    count) and the kind's schema from its footer alone; a mismatch is a ManifestError naming
    ``where``. Columns are read later, each when first used (``Columns``)."""
    try:
        size = len(source) if isinstance(source, bytes) else source.stat().st_size
        # The size first: a table of another build, or a partial copy, is named as such.
        if size != info.get("bytes"):
            raise ManifestError(
                f"{where}: the item table is {size} bytes, the header says {info.get('bytes')} "
                "(a table of another build, or a partial copy): rebuild or restage the cache"
            )
        reader = pq.ParquetFile(pa.BufferReader(source) if isinstance(source, bytes) else source)
        rows, schema = reader.metadata.num_rows, reader.schema_arrow
    except (OSError, pa.ArrowException) as exc:
        raise ManifestError(f"{where}: cannot read the manifest's item table: {exc}") from None
    if rows != info.get("rows"):
        raise ManifestError(
            f"{where}: the item table has {rows} rows, the header says {info.get('rows')}"
        )
    expected = ARROW_SCHEMAS[kind]
    older = pa.schema([f for f in expected if f.name not in OPTIONAL_COLUMNS])
    if not (schema.equals(expected) or schema.equals(older)):
        differ = column_problems(schema, kind)
        found = [f"{info.get('path')}: {line}" for _, line in differ]
        shown = "".join(f"\n  {line}" for line in found[:5])
        more = f"\n  ... and {len(found) - 5} more" if len(found) > 5 else ""
        raise ManifestTypeError(
            f"{where}: item table columns {[name for name, _ in differ]} differ from a {kind!r} "
            f"manifest's:{shown}{more}\n  upgrade octstage or rebuild the cache",
            found,
        )
    return Columns(source, kind, rows, where)


def column_problems(schema: pa.Schema, kind: str) -> list[tuple[str, str]]:
    """How a table's columns differ from ``kind``'s (``ARROW_SCHEMAS``): ``(column, line)`` for
    a column of another Arrow type, one missing, one the kind does not have, or their order."""
    expected = ARROW_SCHEMAS[kind]
    found = []
    for want in expected:
        i = schema.get_field_index(want.name)
        if i < 0:
            if want.name not in OPTIONAL_COLUMNS:
                found.append((want.name, f"column {want.name!r} is missing, expected {want.type}"))
        elif not schema.field(i).type.equals(want.type):
            line = f"column {want.name!r} is {schema.field(i).type}, expected {want.type}"
            found.append((want.name, line))
    what = "field" if kind == "cellpainting" else "volume"
    for f in schema:
        if f.name not in expected.names:
            found.append((f.name, f"column {f.name!r} ({f.type}) is not a {what}'s key"))
    if not found:  # the same columns and types: another order, or another nullability
        order = [n for n in expected.names if n in schema.names]
        found.append(("*", f"columns {schema.names} (as stored), expected {order}"))
    return found


def _dictionary(kind: str) -> list[str]:
    return [c for c in _DICTIONARY if c in ARROW_SCHEMAS[kind].names]


def plain_type(t: pa.DataType) -> pa.DataType:
    """A dictionary column's value type; any other type as it is."""
    return t.value_type if pa.types.is_dictionary(t) else t


def json_row(row: dict[str, Any]) -> dict[str, Any]:
    """A table row as the JSON form's item dict: an unmeasured ``intensity`` (null) is absent,
    the ``clinical`` map (read as key-value pairs) an object."""
    for key in ("intensity", "pack_index"):
        if row.get(key) is None:
            row.pop(key, None)
    if "clinical" in row:
        row["clinical"] = dict(row["clinical"] or ())
    return row
