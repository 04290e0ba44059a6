"""JUMP's Cell Painting layout: where the files are and what the tables say (no storage I/O).

Under a source root (``s3://cellpainting-gallery/cpg0016-jump/<source>/`` or the twin's folder):

- ``workspace/load_data_csv/<batch>/<plate>/load_data_with_illum.csv`` (or ``.parquet``, or
  ``load_data.csv``): one row per field with ``Metadata_Source``, ``Metadata_Batch`` (optional),
  ``Metadata_Plate``, ``Metadata_Well``, ``Metadata_Site`` and, per channel ``<Ch>`` of DNA, AGP,
  ER, Mito, RNA, ``FileName_Orig<Ch>`` + ``PathName_Orig<Ch>`` and (illum tables)
  ``FileName_Illum<Ch>`` + ``PathName_Illum<Ch>``. A PathName is a folder relative to the source
  root, or an absolute URL under it (JUMP's tables give ``s3://cellpainting-gallery/...``).
- ``images/<batch>/images/<plate>/*.tiff``: one 16-bit TIFF per channel and field.
- ``images/<batch>/illum/<plate>/<plate>_Illum<Ch>.npy``: the plate's illumination function per
  channel (float, the image's shape; divide the raw image by it).
- a perturbation table (shipped separately; the twin's is ``metadata/perturbations.csv``):
  ``Metadata_Plate``, ``Metadata_Well``, ``Metadata_JCP2022`` (the perturbation id) and
  ``Metadata_perturbation_type`` (compound, orf, crispr, negcon); ``Metadata_Source`` optional.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass

from octstage.errors import CellPaintingError as LayoutError

CHANNELS = ("DNA", "AGP", "ER", "Mito", "RNA")
LOAD_DATA_NAMES = ("load_data_with_illum.parquet", "load_data_with_illum.csv", "load_data.csv")
LOAD_DATA_ROOT = "workspace/load_data_csv/"
_WELL = re.compile(r"^([A-Z]{1,2})(\d{1,2})$")
PERTURBATION_TYPES = ("compound", "orf", "crispr", "negcon")


@dataclass(frozen=True)
class FieldRow:
    """One row of a load-data table: a field and its channel (and illum) files."""

    source: str
    batch: str
    plate: str
    well: str
    site: int
    images: tuple[tuple[str, str], ...]  # (channel, object name relative to the source root)
    illum: tuple[tuple[str, str], ...]  # the same for illumination functions; empty: none

    @property
    def item_id(self) -> str:
        return f"{self.source}/{self.plate}/{self.well}/{self.site}"


@dataclass(frozen=True)
class Perturbation:
    """What a well received."""

    perturbation: str
    perturbation_type: str  # one of PERTURBATION_TYPES

    @property
    def is_control(self) -> bool:
        return self.perturbation_type == "negcon"


def normalize_well(well: str) -> str:
    """``"A1"``/``"a01"`` -> ``"A01"``; LayoutError for anything that is no well name."""
    m = _WELL.match(well.strip().upper())
    if not m:
        raise LayoutError(f"well {well!r} is not a plate well name (like A01)")
    return f"{m.group(1)}{int(m.group(2)):02d}"


def relative_name(path_name: str, file_name: str, root_url: str) -> str:
    """The object name of ``PathName/FileName`` relative to the source root."""
    folder = path_name.strip()
    root = root_url.rstrip("/")
    if "://" in folder:
        if not (folder + "/").startswith(root + "/"):
            raise LayoutError(f"path {folder!r} is not under the source root {root_url!r}")
        folder = folder[len(root) :]
    folder = folder.strip("/")
    return f"{folder}/{file_name.strip()}" if folder else file_name.strip()


def read_table(data: bytes, name: str) -> list[dict[str, str]]:
    """Rows of a CSV (or, with pyarrow installed, parquet) table as strings."""
    if name.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise LayoutError(
                f"{name}: reading parquet needs pyarrow (pip install pyarrow)"
            ) from exc
        table = pq.read_table(io.BytesIO(data))
        return [
            {k: "" if v is None else str(v) for k, v in row.items()} for row in table.to_pylist()
        ]
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise LayoutError(f"{name}: not a UTF-8 CSV table: {exc}") from exc
    return list(csv.DictReader(io.StringIO(text)))


def parse_load_data(rows: list[dict[str, str]], name: str, root_url: str) -> list[FieldRow]:
    """The fields a load-data table lists; LayoutError names the table, row and column."""
    if not rows:
        raise LayoutError(f"{name}: the load-data table lists no fields")
    need = ["Metadata_Plate", "Metadata_Well", "Metadata_Site"]
    need += [f"{kind}_Orig{c}" for c in CHANNELS for kind in ("FileName", "PathName")]
    missing = [c for c in need if c not in rows[0]]
    if missing:
        raise LayoutError(f"{name}: missing column(s) {', '.join(missing)}")
    has_illum = all(f"FileName_Illum{c}" in rows[0] for c in CHANNELS)
    out: list[FieldRow] = []
    for n, row in enumerate(rows, start=2):  # row 1 is the header
        try:
            site = int(float(row["Metadata_Site"]))
            images = tuple(
                (c, relative_name(row[f"PathName_Orig{c}"], row[f"FileName_Orig{c}"], root_url))
                for c in CHANNELS
            )
            illum = (
                tuple(
                    (
                        c,
                        relative_name(
                            row[f"PathName_Illum{c}"], row[f"FileName_Illum{c}"], root_url
                        ),
                    )
                    for c in CHANNELS
                )
                if has_illum
                else ()
            )
            out.append(
                FieldRow(
                    source=row.get("Metadata_Source", "") or "source",
                    batch=row.get("Metadata_Batch", "") or "",
                    plate=row["Metadata_Plate"].strip(),
                    well=normalize_well(row["Metadata_Well"]),
                    site=site,
                    images=images,
                    illum=illum,
                )
            )
        except (LayoutError, ValueError, KeyError, TypeError) as exc:
            raise LayoutError(f"{name}: row {n}: {exc}") from None
    return out


def parse_perturbations(
    rows: list[dict[str, str]], name: str
) -> dict[tuple[str, str], Perturbation]:
    """``(plate, well) -> Perturbation`` from a perturbation metadata table."""
    need = ["Metadata_Plate", "Metadata_Well", "Metadata_JCP2022", "Metadata_perturbation_type"]
    missing = [c for c in need if rows and c not in rows[0]]
    if missing:
        raise LayoutError(f"{name}: missing column(s) {', '.join(missing)}")
    out: dict[tuple[str, str], Perturbation] = {}
    for n, row in enumerate(rows, start=2):
        kind = row["Metadata_perturbation_type"].strip().lower()
        if kind not in PERTURBATION_TYPES:
            raise LayoutError(
                f"{name}: row {n}: Metadata_perturbation_type {kind!r} is not one of "
                f"{', '.join(PERTURBATION_TYPES)}"
            )
        try:
            key = (row["Metadata_Plate"].strip(), normalize_well(row["Metadata_Well"]))
        except LayoutError as exc:
            raise LayoutError(f"{name}: row {n}: {exc}") from None
        out[key] = Perturbation(row["Metadata_JCP2022"].strip(), kind)
    return out


def write_csv(rows: list[dict[str, object]]) -> bytes:
    """A CSV table (header from the first row's keys)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue().encode("utf-8")
