"""JUMP's perturbation metadata as the jump-cellpainting ``datasets`` repository ships it.

``metadata/`` there holds (all read here as given, ``.csv`` or ``.csv.gz``):

- ``well.csv.gz``: ``Metadata_Source``, ``Metadata_Plate``, ``Metadata_Well``,
  ``Metadata_JCP2022`` (what the well received; ``JCP2022_UNKNOWN`` where nobody knows);
- ``compound.csv.gz``, ``orf.csv.gz``, ``crispr.csv.gz``: one row per ``Metadata_JCP2022`` of
  that modality (which table lists an id is its modality);
- ``perturbation_control.csv``: ``Metadata_JCP2022``, ``Metadata_pert_type`` (poscon, negcon,
  empty), ``Metadata_Name`` (DMSO is ``JCP2022_033924``);
- ``plate.csv.gz`` (Source, Batch, Plate, PlateType): not needed to join a well.

A well's ``perturbation_type`` is its control type when ``perturbation_control.csv`` lists the
id, else its modality. ``--metadata`` is that folder, or one table with ``Metadata_Plate``,
``Metadata_Well``, ``Metadata_JCP2022`` and ``Metadata_perturbation_type`` (a lab's own).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from octstage.cellpainting.layout import normalize_well, read_table
from octstage.errors import CellPaintingError

MODALITIES = ("compound", "orf", "crispr")
CONTROL_TYPES = ("negcon", "poscon", "empty")
PERTURBATION_TYPES = (*MODALITIES, *CONTROL_TYPES)
UNKNOWN = "JCP2022_UNKNOWN"
DMSO = "JCP2022_033924"
TABLES = {
    "well": "well.csv.gz",
    "compound": "compound.csv.gz",
    "orf": "orf.csv.gz",
    "crispr": "crispr.csv.gz",
    "control": "perturbation_control.csv",
}


@dataclass(frozen=True)
class Perturbation:
    """What a well received."""

    perturbation: str
    perturbation_type: str  # one of PERTURBATION_TYPES, "" for JCP2022_UNKNOWN

    @property
    def is_control(self) -> bool:
        return self.perturbation_type == "negcon"


Reader = Callable[[str], tuple[str, bytes]]  # table name -> (where, bytes)
Wells = dict[tuple[str, str], Perturbation]  # (plate, well) -> what it received


def _rows(read: Reader, name: str, need: tuple[str, ...]) -> tuple[str, list[dict[str, str]]]:
    where, data = read(name)
    rows = read_table(data, where)
    missing = [c for c in need if rows and c not in rows[0]]
    if missing:
        raise CellPaintingError(f"{where}: missing column(s) {', '.join(missing)}")
    return where, rows


def _ids(read: Reader, name: str) -> tuple[str, set[str]]:
    where, rows = _rows(read, name, ("Metadata_JCP2022",))
    return where, {r["Metadata_JCP2022"].strip() for r in rows}


def load_release(read: Reader) -> Wells:
    """The wells of the release's tables (``read`` opens them by file name)."""
    types: dict[str, str] = {}
    for modality in MODALITIES:
        where, ids = _ids(read, TABLES[modality])
        for jcp in ids:
            if jcp in types:
                raise CellPaintingError(
                    f"{where}: {jcp} is also listed as {types[jcp]}: one id, one modality"
                )
            types[jcp] = modality
    where, controls = _rows(read, TABLES["control"], ("Metadata_JCP2022", "Metadata_pert_type"))
    for n, row in enumerate(controls, start=2):
        kind = row["Metadata_pert_type"].strip()
        if kind not in CONTROL_TYPES:
            raise CellPaintingError(
                f"{where}: row {n}: column Metadata_pert_type: {kind!r} is not one of "
                f"{', '.join(CONTROL_TYPES)}"
            )
        types[row["Metadata_JCP2022"].strip()] = kind
    where, wells = _rows(
        read, TABLES["well"], ("Metadata_Plate", "Metadata_Well", "Metadata_JCP2022")
    )
    out: Wells = {}
    for n, row in enumerate(wells, start=2):
        jcp = row["Metadata_JCP2022"].strip()
        if jcp != UNKNOWN and jcp not in types:
            raise CellPaintingError(
                f"{where}: row {n}: column Metadata_JCP2022: {jcp!r} is in none of "
                f"{', '.join(TABLES[k] for k in (*MODALITIES, 'control'))}"
            )
        out[_key(row, where, n)] = Perturbation(jcp, types.get(jcp, ""))
    return out


def _key(row: dict[str, str], where: str, n: int) -> tuple[str, str]:
    try:
        return row["Metadata_Plate"].strip(), normalize_well(row["Metadata_Well"])
    except CellPaintingError as exc:
        raise CellPaintingError(f"{where}: row {n}: column Metadata_Well: {exc}") from None


def load_single(rows: list[dict[str, str]], where: str) -> Wells:
    """A lab's own table: plate, well, id and ``Metadata_perturbation_type``."""
    need = ["Metadata_Plate", "Metadata_Well", "Metadata_JCP2022", "Metadata_perturbation_type"]
    missing = [c for c in need if rows and c not in rows[0]]
    if missing:
        raise CellPaintingError(
            f"{where}: missing column(s) {', '.join(missing)} (or give the datasets "
            f"repository's metadata folder: {', '.join(TABLES.values())})"
        )
    out: Wells = {}
    for n, row in enumerate(rows, start=2):
        kind = row["Metadata_perturbation_type"].strip().lower()
        kind = {"trt": ""}.get(kind, kind)
        if kind and kind not in PERTURBATION_TYPES:
            raise CellPaintingError(
                f"{where}: row {n}: column Metadata_perturbation_type: {kind!r} is not one of "
                f"{', '.join(PERTURBATION_TYPES)}"
            )
        out[_key(row, where, n)] = Perturbation(row["Metadata_JCP2022"].strip(), kind)
    return out


class Unlabelled:
    """Fields of the load-data tables whose plate and well the metadata does not list: counted,
    and the first few named per table, so a refusal says where to look (a plate absent from the
    metadata altogether, or one well of a listed plate)."""

    SHOWN = 3  # fields named per table, and tables named

    def __init__(self, wells: Wells) -> None:
        self._wells = wells
        self._plates = {plate for plate, _ in wells}
        self.count = 0
        self.named: dict[str, list[str]] = {}  # table -> its first few, described

    def add(self, table: str, plate: str, well: str) -> bool:
        """Count the field when the metadata does not list its plate and well; whether it did."""
        if (plate, well) in self._wells:
            return False
        self.count += 1
        named = self.named.setdefault(table, [])
        said = (
            f"plate {plate} well {well} (the plate is listed, this well is not)"
            if plate in self._plates
            else f"plate {plate} (absent from the metadata)"
        )
        if len(named) < self.SHOWN and said not in named:
            named.append(said)
        return True

    def refusal(self, metadata: str) -> str:
        """The message that refuses them, naming the tables, plates and wells and the way out."""
        tables = list(self.named.items())
        where = "; ".join(f"{table}: {', '.join(said)}" for table, said in tables[: self.SHOWN])
        if len(tables) > self.SHOWN:  # a source of 2,000 plates: one table each
            where += f"; and {len(tables) - self.SHOWN} more table(s)"
        return (
            f"{self.count} field(s) of the load-data tables have no perturbation in --metadata "
            f"{metadata}: {where}. Their perturbation would be empty: check that the metadata "
            "is the release's for these plates (well.csv.gz lists every plate and well), "
            "narrow the build with --select-plate, or pass --allow-unlabelled to build them "
            "with an empty perturbation (counted in the summary and the manifest's counts)"
        )
