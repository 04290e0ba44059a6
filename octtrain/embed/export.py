"""The export's files besides the parts: the plan, the per-group table and the header, written last.

* ``embed-plan.json`` (``PLAN``), written when an export starts: whose export this is (the
  checkpoint's and the manifest's SHA-256, the encoder, split, limit, part size, prefix, item
  count). The one output-folder rule (``octstage.outputs.claim_export_folder``) resumes only an
  export of the same identity and refuses any other folder.
* ``wells.parquet`` / ``participants.parquet`` (``write_groups``): the mean of each group's item
  embeddings, streamed from the finished parts (``aggregate.GroupMeans``), rows in the order
  groups complete.
* ``embed.json`` (``HEADER``), written last by process 0: the parts and the group table with
  their row counts and SHA-256, the checkpoint (path, step, SHA-256, encoder), the run's config,
  the manifest's identity, the feature columns. A reader that finds the header finds complete
  parts, as a reader of the manifest does (``read_header`` checks each against it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from octstage.manifest import atomic_write_text
from octtrain.embed.aggregate import GroupMeans
from octtrain.embed.parts import PARTS, Part, read_part_batches, sha256_file
from octtrain.embed.tables import GROUPS, feature_names, group_schema
from octtrain.errors import DataError

PLAN = "embed-plan.json"
HEADER = "embed.json"
FORMAT = 1
GROUP_TABLES = {name for *_, name in GROUPS.values()}


def own(name: str) -> bool:
    """Whether a name in an export folder is the export's (the plan aside)."""
    return name in {HEADER, PARTS, *GROUP_TABLES} or name.startswith(".")


def remove_stale(folder: Path) -> list[str]:
    """Delete the temporary files an earlier run left (``.<name>.<pid>.tmp``: a part or a group
    table it was writing when a SIGKILL or a power cut ended it); their names, for the log.
    Called on process 0 at setup, before any process writes: one export folder, one run."""
    removed = []
    for place in (folder, folder / PARTS):
        for path in sorted(place.glob(".*.tmp")) if place.is_dir() else []:
            path.unlink(missing_ok=True)
            removed.append(str(path.relative_to(folder)))
    return removed


def _expected(folder: Path, parts: Sequence[Part], keys: Sequence[str]) -> dict[Any, int]:
    """Items per group key, from the parts' key columns alone."""
    tables = [pq.read_table(folder / p.name, columns=list(keys)) for p in parts]
    table = pa.concat_tables(tables)
    counts = table.group_by(list(keys)).aggregate([([], "count_all")])
    columns = [counts.column(k).to_pylist() for k in keys]
    return dict(
        zip(zip(*columns, strict=True), counts.column("count_all").to_pylist(), strict=True)
    )


def write_groups(
    folder: Path, parts: Sequence[Part], kind: str, prefix: str, dim: int
) -> dict[str, Any]:
    """The per-group table from the finished ``parts``; returns its entry for the header."""
    keys, carried, count, name = GROUPS[kind]
    schema = group_schema(kind, prefix, dim)
    features = feature_names(prefix, dim)
    means = GroupMeans(_expected(folder, parts, keys))
    tmp = folder / f".{name}.{os.getpid()}.tmp"
    rows: list[dict[str, Any]] = []
    total = 0
    writer = pq.ParquetWriter(tmp, schema, compression="zstd")
    try:
        for part in parts:
            for batch in read_part_batches(folder, part.name):
                key_cols = [batch.column(k).to_pylist() for k in keys]
                kept = [batch.column(c).to_pylist() for c in carried]
                x = np.column_stack([batch.column(f).to_numpy() for f in features])
                finished = means.add(
                    list(zip(*key_cols, strict=True)), x, list(zip(*kept, strict=True))
                )
                for key, info, mean, n in finished:
                    rows.append({"key": key, "info": info, "mean": mean, "n": n})
                if len(rows) >= 1024:
                    writer.write_table(_group_rows(rows, keys, carried, count, features, schema))
                    total, rows = total + len(rows), []
        means.close()
        if rows:
            writer.write_table(_group_rows(rows, keys, carried, count, features, schema))
            total += len(rows)
        writer.close()
        os.replace(tmp, folder / name)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return {"name": name, "rows": total, "sha256": sha256_file(folder / name)}


def _group_rows(
    rows: list[dict[str, Any]],
    keys: Sequence[str],
    carried: Sequence[str],
    count: str,
    features: Sequence[str],
    schema: pa.Schema,
) -> pa.Table:
    data: dict[str, Any] = {}
    for i, k in enumerate(keys):
        data[k] = [r["key"][i] for r in rows]
    for i, c in enumerate(carried):
        data[c] = [r["info"][i] for r in rows]
    data[count] = [r["n"] for r in rows]
    means = np.stack([r["mean"] for r in rows]).astype(np.float32)
    for j, f in enumerate(features):
        data[f] = means[:, j]
    return pa.Table.from_pydict(data, schema=schema)


def write_header(folder: Path, header: dict[str, Any]) -> None:
    """The header, atomically: the last file an export writes."""
    atomic_write_text(folder / HEADER, json.dumps(header, indent=2))


def read_header(folder: Path, check: bool = True) -> dict[str, Any]:
    """An export's header; with ``check``, each part and table it names is verified (row count
    from the footer, SHA-256 of the bytes). DataError naming the file otherwise."""
    path = folder / HEADER
    try:
        header: Any = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path}: no export header (the export has not finished)") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable export header ({exc})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise DataError(f"{path}: not an export header of format {FORMAT}")
    if check:
        for entry in [*header["parts"], header["groups"]]:
            file = folder / entry["name"]
            try:
                rows = pq.ParquetFile(file).metadata.num_rows
                sha = sha256_file(file)
            except (OSError, pa.ArrowException) as exc:
                raise DataError(f"{file}: unreadable ({exc})") from None
            if rows != entry["rows"] or sha != entry["sha256"]:
                raise DataError(
                    f"{file}: differs from the header {path} (rows {rows}, header {entry['rows']};"
                    " or its SHA-256): embed again with the same command to mend it"
                )
    return header


def header_matches(folder: Path, identity: dict[str, Any]) -> bool:
    """Whether ``folder`` holds a finished export of ``identity`` whose files all check."""
    try:
        header = read_header(folder)
    except DataError:
        return False
    return bool(header.get("identity") == identity)


def read_items(folder: Path) -> pa.Table:
    """Every item's row of a finished export, parts in order (checked against the header)."""
    header = read_header(folder)
    return pa.concat_tables(pq.read_table(folder / p["name"]) for p in header["parts"])


def read_groups(folder: Path) -> pa.Table:
    """The per-group table of a finished export (checked against the header)."""
    header = read_header(folder)
    return pq.read_table(folder / header["groups"]["name"])
