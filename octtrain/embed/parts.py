"""The export's parts: which items each holds, how one is written, and whether one is complete.

The selected items are cut into parts of ``part_size`` consecutive items (``plan``), a plan that
depends on the items and the part size alone, never on how many processes run: process ``r`` of
``w`` embeds parts ``r, r + w, r + 2w, ...`` (``mine``), so a run resumed with another number of
processes finds the same parts. A part is written a row group at a time to a temporary file
beside its place (``PartWriter``), fsynced, renamed into place, and then its record
(``part-NNNNN.json``: rows, item range, SHA-256 of the file) is written: a part with a record
whose checksum and row count match is complete (``check_part``); anything else is embedded
again.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from octstage.manifest import atomic_write_text, file_sha256

PARTS = "parts"  # the folder of the parts inside the export
ROWS_PER_GROUP = 1024  # rows a part's row group holds: what a writer keeps in memory


@dataclass(frozen=True)
class Part:
    """Items ``[start, stop)`` of the selection, written as ``parts/part-<index>.parquet``."""

    index: int
    start: int
    stop: int

    @property
    def name(self) -> str:
        return f"{PARTS}/part-{self.index:05d}.parquet"

    @property
    def record(self) -> str:
        return f"{PARTS}/part-{self.index:05d}.json"

    @property
    def rows(self) -> int:
        return self.stop - self.start


def plan(items: int, part_size: int) -> list[Part]:
    """The parts of ``items`` selected items, ``part_size`` each (the last one shorter)."""
    if part_size < 1:
        raise ValueError(f"part size {part_size}: must be at least 1")
    return [
        Part(i, start, min(start + part_size, items))
        for i, start in enumerate(range(0, items, part_size))
    ]


def mine(parts: list[Part], rank: int, world: int) -> list[Part]:
    """The parts process ``rank`` of ``world`` embeds."""
    return parts[rank::world]


def sha256_file(path: Path) -> str:
    """``sha256:<hex>`` of a file's bytes (the manifest's own hashing, with the prefix the
    manifest and the checkpoints use)."""
    return "sha256:" + file_sha256(path)


@dataclass(frozen=True)
class PartRecord:
    """What a finished part's record says."""

    name: str
    start: int
    stop: int
    rows: int
    sha256: str


def check_part(folder: Path, part: Part) -> tuple[PartRecord | None, str]:
    """(the part's record, "") when the part is complete; else (None, why not)."""
    try:
        data: Any = json.loads((folder / part.record).read_text(encoding="utf-8"))
        record = PartRecord(**data)
    except FileNotFoundError:
        return None, "not written"
    except (OSError, ValueError, TypeError) as exc:
        return None, f"its record {part.record} is unreadable ({exc})"
    if (record.name, record.start, record.stop, record.rows) != (
        part.name,
        part.start,
        part.stop,
        part.rows,
    ):
        return None, f"its record {part.record} describes other items"
    path = folder / part.name
    try:
        found = sha256_file(path)
    except OSError as exc:
        return None, f"{part.name} is unreadable ({exc.strerror or exc})"
    if found != record.sha256:
        return (
            None,
            f"{part.name} is damaged (SHA-256 {found[:19]}..., its record says "
            f"{record.sha256[:19]}...)",
        )
    return record, ""


def temporary(folder: Path, part: Part) -> Path:
    """Where this process writes ``part`` until it is finished (a hidden name: never a part)."""
    path = folder / part.name
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


class PartWriter:
    """Writes one part: ``write`` batches as they come, row groups of ``ROWS_PER_GROUP``;
    ``finish`` makes the part complete (file in place, then its record)."""

    def __init__(self, folder: Path, part: Part, schema: pa.Schema) -> None:
        self.folder, self.part, self.schema = folder, part, schema
        self.path = folder / part.name
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = temporary(folder, part)
        self.writer = pq.ParquetWriter(self.tmp, schema, compression="zstd")
        self.pending: list[pa.RecordBatch] = []
        self.rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        self.pending.append(batch)
        self.rows += batch.num_rows
        if sum(b.num_rows for b in self.pending) >= ROWS_PER_GROUP:
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            self.writer.write_table(pa.Table.from_batches(self.pending, self.schema))
            self.pending = []

    def finish(self) -> PartRecord:
        """The part in place and its record written; ValueError when it holds another count
        of rows than its items. A failed write (a full disk) names the part's file."""
        try:
            self._flush()
            self.writer.close()
        except OSError as exc:  # pyarrow's names no file
            raise OSError(exc.errno, exc.strerror or str(exc), str(self.tmp)) from None
        if self.rows != self.part.rows:
            raise ValueError(f"{self.part.name}: {self.rows} rows for {self.part.rows} items")
        with self.tmp.open("rb") as fh:
            os.fsync(fh.fileno())
        record = PartRecord(
            self.part.name, self.part.start, self.part.stop, self.rows, sha256_file(self.tmp)
        )
        os.replace(self.tmp, self.path)
        atomic_write_text(self.folder / self.part.record, json.dumps(asdict(record)))
        return record

    def abort(self) -> None:
        """Drop the temporary file (an interrupted part leaves nothing that looks finished),
        also when a second Ctrl-C lands while the writer closes (then raised after it)."""
        try:
            with contextlib.suppress(Exception):
                self.writer.close()
        finally:
            self.tmp.unlink(missing_ok=True)


def read_part_batches(folder: Path, name: str) -> Iterator[pa.RecordBatch]:
    """A part's (or any table's) rows, a row group at a time."""
    reader = pq.ParquetFile(folder / name)
    for i in range(reader.num_row_groups):
        yield from reader.read_row_group(i).to_batches()
