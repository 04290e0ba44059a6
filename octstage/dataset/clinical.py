"""Clinical values from the release's ``clinical_data/`` OMOP tables, by concept id.

``measurement.csv`` (``measurement_concept_id``, ``value_as_number``, ``measurement_source_value``,
``unit_source_value``) and ``observation.csv`` (``observation_concept_id``, or the condition named
by ``qualifier_concept_id`` as aireadi-loader reads it), keyed by ``person_id``. A participant's
value is the first usable row in table order (the loader does the same); a value that is one of
AI-READI's missing codes (555, 777, 888, 999) or blank is dropped and counted, never used.

``parse_concepts`` is pure; a table without the columns it needs, a value that is not a number, or
a concept id found in no table raises ``ReleaseError`` naming the file, line, column and value.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from octstage.dataset.release import MISSING_CODES
from octstage.errors import ObjectNotFoundError, ReleaseError, StorageError
from octstage.manifest import Concept
from octstage.storage import Storage

CLINICAL_DIR = "clinical_data"
# table -> (its concept column, its source-value column)
TABLES: dict[str, tuple[str, str]] = {
    "measurement": ("measurement_concept_id", "measurement_source_value"),
    "observation": ("observation_concept_id", "observation_source_value"),
}
BLANK = "blank"


@dataclass
class _Found:
    table: str
    name: str = ""
    unit: str = ""
    values: dict[str, float] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)


def parse_concepts(
    texts: Mapping[str, str], concept_ids: Sequence[int], source: str
) -> tuple[dict[int, dict[str, float]], tuple[Concept, ...]]:
    """Per concept: participant -> value, and its ``Concept`` summary. ``texts`` maps a table
    name (``measurement``, ``observation``) to its CSV text; ``source`` is the folder's name."""
    wanted = {int(c) for c in concept_ids}
    found: dict[int, _Found] = {}
    for table, text in texts.items():
        concept_col, name_col = TABLES[table]
        where = f"{source}/{table}.csv"
        reader = csv.DictReader(io.StringIO(text.lstrip("\ufeff")))
        columns = [c.strip() for c in reader.fieldnames or []]
        reader.fieldnames = columns
        need = [c for c in ("person_id", concept_col, "value_as_number") if c not in columns]
        if need:
            raise ReleaseError(f"{where}: missing column(s) {', '.join(need)}; found {columns}")
        for line, row in enumerate(reader, start=2):
            concept = _concept(row, concept_col, where, line)
            qualifier = _concept(row, "qualifier_concept_id", where, line)
            hit = concept if concept in wanted else qualifier if qualifier in wanted else None
            if hit is None:
                continue
            got = found.setdefault(hit, _Found(table))
            got.name = got.name or (row.get(name_col) or "").strip()
            got.unit = got.unit or (row.get("unit_source_value") or "").strip()
            pid = (row.get("person_id") or "").strip()
            raw = (row.get("value_as_number") or "").strip()
            value = _number(raw, where, line)
            if value is None or value in MISSING_CODES:
                code = BLANK if value is None else str(int(value))
                got.missing[code] = got.missing.get(code, 0) + 1
            elif pid not in got.values:
                got.values[pid] = value
    unknown = sorted(wanted - set(found))
    if unknown:
        raise ReleaseError(
            f"{source}: concept id(s) {', '.join(map(str, unknown))} in none of "
            f"{', '.join(f'{t}.csv' for t in texts)}"
        )
    values = {c: found[c].values for c in sorted(wanted)}
    concepts = tuple(
        Concept(c, f.name, f.unit, f.table, len(f.values), dict(sorted(f.missing.items())))
        for c, f in sorted(found.items())
    )
    return values, concepts


def _concept(row: Mapping[str, str | None], column: str, where: str, line: int) -> int | None:
    raw = (row.get(column) or "").strip()
    if not raw:
        return None
    try:
        return int(float(raw))
    except ValueError:
        raise ReleaseError(f"{where}:{line}: {column} {raw!r} is not a concept id") from None


def _number(raw: str, where: str, line: int) -> float | None:
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ReleaseError(f"{where}:{line}: value_as_number {raw!r} is not a number") from None


def read_concepts(
    storage: Storage, concept_ids: Sequence[int]
) -> tuple[dict[int, dict[str, float]], tuple[Concept, ...]]:
    """``parse_concepts`` over the dataset root's clinical_data/ tables."""
    source = f"{storage.url}/{CLINICAL_DIR}"
    texts: dict[str, str] = {}
    for table in TABLES:
        try:
            data = storage.read_bytes(f"{CLINICAL_DIR}/{table}.csv")
        except ObjectNotFoundError:
            continue
        except StorageError as exc:
            raise ReleaseError(f"{source}/{table}.csv: cannot read: {exc}") from exc
        try:
            texts[table] = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ReleaseError(f"{source}/{table}.csv: not UTF-8 text: {exc}") from exc
    if not texts:
        raise ReleaseError(
            f"{source}: no measurement.csv or observation.csv; --concept needs the release's "
            "clinical_data/ OMOP tables"
        )
    return parse_concepts(texts, concept_ids, source)
