"""What the AI-READI release itself says: ``retinal_oct/manifest.tsv`` and its value spellings.

The release indexes every OCT file in ``retinal_oct/manifest.tsv`` (participant, eye, device,
anatomic region, frames x height x width, file path); the AI-READI team's own loader
(``aireadi-loader``) trusts that table alone. Spellings are the ones that loader matches:
manufacturer ``Heidelberg`` / ``Topcon`` / ``Zeiss``, model ``Spectralis`` / ``Maestro2`` /
``Triton`` / ``Cirrus``, ``imaging`` ``OCT``, laterality ``R`` / ``L``, and an anatomic region
that carries the scan size where the device has several (``Macula, 6 x 6``).

``parse_manifest_tsv`` is pure: text in, one ``TsvRow`` per file out, keyed by the file's path
relative to the dataset root. A table that cannot be trusted as a whole (a missing column, a
value that is not a number, a path listed twice) raises ``ReleaseError`` naming the file, the
line, the column and the value. ``read_manifest_tsv`` fetches it from a dataset root.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

from octstage.errors import ObjectNotFoundError, ReleaseError
from octstage.storage import Storage

TSV_NAME = "retinal_oct/manifest.tsv"
# Device folder -> (manufacturer, manufacturers_model_name) as manifest.tsv spells them.
DEVICE_MODELS: dict[str, tuple[str, str]] = {
    "heidelberg_spectralis": ("Heidelberg", "Spectralis"),
    "topcon_maestro2": ("Topcon", "Maestro2"),
    "topcon_triton": ("Topcon", "Triton"),
    "zeiss_cirrus": ("Zeiss", "Cirrus"),
}
MODEL_DEVICES: dict[str, str] = {model: dev for dev, (_, model) in DEVICE_MODELS.items()}
# The OCT anatomic regions each device has in the release (aireadi-loader's access table).
DEVICE_REGIONS: dict[str, tuple[str, ...]] = {
    "heidelberg_spectralis": ("Macula", "Optic Disc"),
    "topcon_maestro2": ("Macula", "Macula, 6 x 6", "Wide Field"),
    "topcon_triton": ("Macula, 12 x 12", "Macula, 6 x 6", "Optic Disc"),
    "zeiss_cirrus": ("Macula", "Macula, 6 x 6", "Optic Disc", "Optic Disc, 6 x 6"),
}
# AI-READI's codes for a value that is missing (refused, unknown, not asked, not applicable).
MISSING_CODES: tuple[int, ...] = (555, 777, 888, 999)
ID_COLUMNS: tuple[str, ...] = ("participant_id", "person_id")  # person_id from v3 on
REQUIRED_COLUMNS: tuple[str, ...] = (
    "manufacturer",
    "manufacturers_model_name",
    "anatomic_region",
    "imaging",
    "laterality",
    "height",
    "width",
    "number_of_frames",
    "filepath",
)


@dataclass(frozen=True)
class TsvRow:
    """One file as ``manifest.tsv`` describes it."""

    line: int  # 1-based line in the table (the header is line 1)
    participant_id: str
    manufacturer: str
    model: str
    anatomic_region: str  # as spelled: "Macula, 6 x 6"
    imaging: str
    laterality: str  # "L" / "R" as written (upper-cased)
    frames: int
    height: int
    width: int
    path: str  # relative to the dataset root (the table's leading "/" removed)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.frames, self.height, self.width)

    @property
    def device(self) -> str | None:
        """The structural_oct/ folder this model's files live in; None for an unknown model."""
        return MODEL_DEVICES.get(self.model)


def split_region(anatomic_region: str) -> tuple[str, str]:
    """``"Macula, 6 x 6"`` -> ``("Macula", "6 x 6")``; ``"Wide Field"`` -> ``("Wide Field", "")``
    (the scan size is empty where the release gives none)."""
    region, _, size = anatomic_region.partition(",")
    return region.strip(), size.strip()


def parse_manifest_tsv(text: str, source: str) -> dict[str, TsvRow]:
    """Every row of the table by relative path; ``source`` names the table in errors."""
    reader = csv.DictReader(io.StringIO(text.lstrip("\ufeff")), delimiter="\t")
    columns = [c.strip() for c in reader.fieldnames or []]
    reader.fieldnames = columns
    id_col = next((c for c in ID_COLUMNS if c in columns), None)
    absent = [c for c in REQUIRED_COLUMNS if c not in columns]
    if id_col is None or absent:
        need = ([] if id_col else ["participant_id (or person_id)"]) + absent
        raise ReleaseError(f"{source}: missing column(s) {', '.join(need)}; found {columns}")
    rows: dict[str, TsvRow] = {}
    for line, raw in enumerate(reader, start=2):
        if None in raw:  # more cells than the header names: a shifted or merged row
            raise ReleaseError(f"{source}:{line}: more cells than the header has columns")

        def cell(column: str, line: int = line, raw: dict[str, str] = raw) -> str:
            value = raw.get(column)
            if value is None:
                raise ReleaseError(f"{source}:{line}: column {column} is missing from the row")
            return value.strip()

        def number(column: str, line: int = line) -> int:
            value = cell(column)
            try:
                n = int(value)
            except ValueError:
                n = 0
            if n < 1:
                raise ReleaseError(
                    f"{source}:{line}: {column} {value!r} is not a positive whole number"
                )
            return n

        path = cell("filepath").lstrip("/")
        if not path:
            raise ReleaseError(f"{source}:{line}: filepath is empty")
        if path in rows:
            raise ReleaseError(
                f"{source}:{line}: filepath /{path} is listed twice (first on line "
                f"{rows[path].line})"
            )
        rows[path] = TsvRow(
            line=line,
            participant_id=cell(id_col),
            manufacturer=cell("manufacturer"),
            model=cell("manufacturers_model_name"),
            anatomic_region=cell("anatomic_region"),
            imaging=cell("imaging"),
            laterality=cell("laterality").upper(),
            frames=number("number_of_frames"),
            height=number("height"),
            width=number("width"),
            path=path,
        )
    return rows


def read_manifest_tsv(storage: Storage) -> dict[str, TsvRow] | None:
    """The dataset root's ``retinal_oct/manifest.tsv`` parsed, or None when it has none."""
    try:
        data = storage.read_bytes(TSV_NAME)
    except ObjectNotFoundError:
        return None
    source = f"{storage.url}/{TSV_NAME}"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReleaseError(f"{source}: not UTF-8 text: {exc}") from exc
    return parse_manifest_tsv(text, source)
