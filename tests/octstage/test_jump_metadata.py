"""JUMP's metadata tables joined to wells (``cellpainting.metadata.load_release``): what a well
received, and the contradictions between the tables that stop a build."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from octstage.cellpainting.metadata import DMSO, TABLES, Perturbation, Reader, load_release
from octstage.errors import CellPaintingError

GOOD = {
    "well": "Metadata_Source,Metadata_Plate,Metadata_Well,Metadata_JCP2022\n"
    f"source_1,P1,A01,{DMSO}\nsource_1,P1,A02,JCP2022_000001\n"
    "source_1,P1,B01,JCP2022_000002\nsource_1,P1,B02,JCP2022_UNKNOWN\n",
    "compound": f"Metadata_JCP2022\n{DMSO}\nJCP2022_000001\n",
    "orf": "Metadata_JCP2022\nJCP2022_000002\n",
    "crispr": "Metadata_JCP2022\n",
    "control": f"Metadata_JCP2022,Metadata_pert_type,Metadata_Name\n{DMSO},negcon,DMSO\n",
}


def _reader(tables: dict[str, str]) -> Reader:
    def read(name: str) -> tuple[str, bytes]:
        kind = next(k for k, v in TABLES.items() if v == name)
        data = tables[kind].encode()
        return name, gzip.compress(data) if name.endswith(".gz") else data

    return read


def test_a_well_gets_its_control_type_else_its_modality() -> None:
    wells = load_release(_reader(GOOD))
    assert wells[("P1", "A01")] == Perturbation(DMSO, "negcon")
    assert wells[("P1", "A02")] == Perturbation("JCP2022_000001", "compound")
    assert wells[("P1", "B01")] == Perturbation("JCP2022_000002", "orf")
    assert wells[("P1", "B02")] == Perturbation("JCP2022_UNKNOWN", "")


BAD = {
    "an id in two modalities": (
        {"crispr": "Metadata_JCP2022\nJCP2022_000002\n"},
        r"crispr\.csv\.gz: JCP2022_000002 is also listed as orf",
    ),
    "a control of an unknown type": (
        {"control": f"Metadata_JCP2022,Metadata_pert_type\n{DMSO},negative\n"},
        r"perturbation_control\.csv: row 2: column Metadata_pert_type: 'negative'",
    ),
    "a well naming an id in no table": (
        {"well": "Metadata_Plate,Metadata_Well,Metadata_JCP2022\nP1,A01,JCP2022_999999\n"},
        r"well\.csv\.gz: row 2: column Metadata_JCP2022: 'JCP2022_999999' is in none of",
    ),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_tables_that_contradict_each_other_are_refused_naming_table_row_and_id(case: str) -> None:
    change, message = BAD[case]
    with pytest.raises(CellPaintingError, match=message):
        load_release(_reader({**GOOD, **change}))


def test_an_absolute_metadata_path_that_does_not_exist_is_named_as_missing(tmp_path: Path) -> None:
    """Not read as a key under the source root (which refused it as an "unsafe object name")."""
    from octstage.cellpainting.build import load_metadata
    from octstage.errors import OctstageError
    from octstage.storage import open_storage

    with pytest.raises(OctstageError, match="no such object"):
        load_metadata(str(tmp_path / "nope.csv"), open_storage(str(tmp_path)))
