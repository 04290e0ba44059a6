"""A Cell Painting build's fields, kept on disk as they are made, never as a list in memory.

A whole JUMP source is ~1M fields; as ``Field`` objects (and then one JSON document) they were
~50 KB each at the end of a build. ``FieldSpool`` writes each plate's fields as gzip-compressed
JSON lines (the JSON form's item dicts, label left out: the classes are known only at the end)
into a temporary folder, counts them as they come (``FieldTally``), and hands them back one at a
time with their labels to ``serial.write`` (``rows``). A plate is all or nothing: its fields go
into a ``PlateSpool`` that is either committed whole (appended to the spool as one more gzip
member; a file of several members reads as one) or dropped (a plate left out for an environment
fault). Memory is one plate's counts; disk ~0.3 KB per field, in the system's temporary folder.
"""

from __future__ import annotations

import gzip
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from octstage.manifest.model import Field, FieldTally
from octstage.manifest.serial import field_row


class PlateSpool:
    """One plate's fields, until ``commit`` (or dropped on ``close``)."""

    def __init__(self, spool: FieldSpool, path: Path) -> None:
        self._spool = spool
        self._path = path
        # open until commit or close: a plate's fields arrive one by one
        self._file = gzip.open(path, "wt", encoding="utf-8", compresslevel=3)  # noqa: SIM115
        self.tally = FieldTally()

    def add(self, field: Field) -> None:
        self.tally.add(field)
        row = field_row(field)
        row.pop("label")
        self._file.write(json.dumps(row, separators=(",", ":")) + "\n")

    def commit(self) -> None:
        """The plate's fields join the spool (in the order they were added)."""
        self._file.close()
        self._spool.append(self._path, self.tally)

    def close(self) -> None:
        self._file.close()
        self._path.unlink(missing_ok=True)


class FieldSpool:
    """Every committed plate's fields, in order; a context manager removing its folder."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="octstage-fields-"))
        self._path = self._dir / "fields.jsonl.gz"
        self._path.touch()
        self._plates = 0
        self.tally = FieldTally()
        self._waiting: dict[int, tuple[Path, FieldTally]] = {}  # ``put`` parts ahead of order
        self._next = 0

    def plate(self) -> PlateSpool:
        self._plates += 1
        return PlateSpool(self, self._dir / f"plate-{self._plates}.jsonl.gz")

    def append(self, part: Path, tally: FieldTally) -> None:
        with open(self._path, "ab") as out, open(part, "rb") as f:
            shutil.copyfileobj(f, out)
        part.unlink()
        self.tally.merge(tally)

    def contents(self) -> bytes:
        """Every committed plate's fields as stored (gzip JSON lines), for another spool's
        ``put``: a plate built on a dask worker travels back to the driver this way."""
        return self._path.read_bytes()

    def put(self, index: int, contents: bytes, tally: FieldTally) -> None:
        """Another spool's ``contents`` as part ``index`` (0, 1, ...; empty for a plate left
        out): parts join in index order whatever order they arrive in, each waiting on disk, so
        a build on many workers lists its fields as the one-process build does."""
        if index == self._next:  # in order: straight into the spool, no part file
            with open(self._path, "ab") as out:
                out.write(contents)
            self.tally.merge(tally)
            self._next += 1
        else:
            part = self._dir / f"part-{index}.jsonl.gz"
            part.write_bytes(contents)
            self._waiting[index] = (part, tally)
        while self._next in self._waiting:
            self.append(*self._waiting.pop(self._next))
            self._next += 1

    @property
    def classes(self) -> tuple[str, ...]:
        """The perturbations of the spooled fields, sorted: ``label`` indexes them."""
        return tuple(sorted(self.tally.perturbations))

    def rows(self) -> Iterator[dict[str, Any]]:
        """The fields as the JSON form's dicts, labelled, one at a time (for ``serial.write``)."""
        index = {c: i for i, c in enumerate(self.classes)}
        with gzip.open(self._path, "rt", encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                label = index.get(row["perturbation"]) if row["perturbation"] else None
                # The JSON form's key order: label after split.
                yield {**{k: row[k] for k in ("item_id", "split")}, "label": label, **row}

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)
