"""JUMP's Cell Painting layout: where the files are and what the load-data tables say (no I/O).

The dataset root (``s3://cellpainting-gallery/cpg0016-jump/``, a mirror or local copy of it, or
the twin's ``cpg0016-jump/`` folder) holds one folder per source; a source root
(``.../cpg0016-jump/source_4/``) may be given instead. Under each source:

- ``workspace/load_data_csv/<batch>/<plate>/load_data_with_illum.parquet`` (also ``.csv.gz``,
  ``.csv``, and the ``load_data.*`` tables without illumination): one row per field with
  ``Metadata_Source``, ``Metadata_Batch``, ``Metadata_Plate``, ``Metadata_Well``,
  ``Metadata_Site`` and, per channel ``<Ch>`` of DNA, AGP, ER, Mito, RNA, the image as
  ``URL_Orig<Ch>`` (or the gallery's documented ``URL_<Ch>``, an absolute ``s3://`` URL) and/or
  ``FileName_Orig<Ch>`` + ``PathName_Orig<Ch>`` (the release's PathNames are ``s3://`` folders),
  and the illumination function as ``URL_Illum<Ch>`` or ``FileName_Illum<Ch>`` +
  ``PathName_Illum<Ch>``. Where a table gives both forms, they must name the same object.
- ``images/<batch>/images/<folder>/...``: one 16-bit TIFF per channel and field, named as the
  microscope names it (``microscopes.py``); ``images/<batch>/illum/<plate>/<plate>_Illum<Ch>.npy``.

Absolute URLs are turned into object names under the root given to build-cache; a ``PrefixMap``
first rewrites them (``s3://cellpainting-gallery/cpg0016-jump/=/data/jump/``) so that a mirror
or a local copy is read instead of the bucket the tables name.
"""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import os
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO

from octstage.errors import CellPaintingError as LayoutError
from octstage.heap import arrow_system_pool

CHANNELS = ("DNA", "AGP", "ER", "Mito", "RNA")
# Preferred first: the parquet the release ships, then its CSV forms.
LOAD_DATA_NAMES = (
    "load_data_with_illum.parquet",
    "load_data_with_illum.csv.gz",
    "load_data_with_illum.csv",
    "load_data.parquet",
    "load_data.csv.gz",
    "load_data.csv",
)
LOAD_DATA_ROOT = "workspace/load_data_csv/"
_WELL = re.compile(r"^([A-Z]{1,2})(\d{1,2})$")


@dataclass(frozen=True, slots=True)
class FieldRow:
    """One row of a load-data table: a field and its channel (and illum) files."""

    source: str
    batch: str
    plate: str
    well: str
    site: int
    images: tuple[tuple[str, str], ...]  # (channel, object name relative to the root)
    illum: tuple[tuple[str, str], ...]  # the same for illumination functions; empty: none

    @property
    def item_id(self) -> str:
        return f"{self.source}/{self.plate}/{self.well}/{self.site}"


@dataclass(frozen=True)
class PrefixMap:
    """``FROM=TO`` rewrites of absolute URLs in the tables, longest ``FROM`` first."""

    pairs: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, specs: Sequence[str]) -> PrefixMap:
        pairs = []
        for spec in specs:
            src, sep, dst = spec.partition("=")
            if not sep or not src.strip() or not dst.strip():
                raise LayoutError(f"prefix map {spec!r}: expected FROM=TO (both non-empty)")
            pairs.append((src.strip(), dst.strip()))
        return cls(tuple(sorted(pairs, key=lambda p: -len(p[0]))))

    def apply(self, url: str) -> str:
        for src, dst in self.pairs:
            if url.startswith(src):
                return dst + url[len(src) :]
        return url


NO_PREFIXES = PrefixMap()


def normalize_well(well: str) -> str:
    """``"A1"``/``"a01"`` -> ``"A01"``; LayoutError for anything that is no well name."""
    m = _WELL.match(well.strip().upper())
    if not m:
        raise LayoutError(f"well {well!r} is not a plate well name (like A01)")
    return f"{m.group(1)}{int(m.group(2)):02d}"


def _root_form(url: str) -> str:
    """A URL as written; a local path made absolute (``data/jump`` and ``/work/data/jump`` are
    one folder, whichever form the root and the prefix map's target were given in)."""
    url = url.removeprefix("file://")
    return url.rstrip("/") if "://" in url else os.path.abspath(url)


def relative_name(
    path_name: str, file_name: str, root_url: str, prefixes: PrefixMap | None = None
) -> str:
    """The object name of ``PathName/FileName`` relative to the root (``file_name`` empty: the
    path is the whole URL)."""
    folder = path_name.strip()
    name = file_name.strip()
    full = f"{folder.rstrip('/')}/{name}" if name else folder
    absolute = "://" in full or full.startswith("/")
    if not absolute:
        return full.strip("/")
    prefixes = prefixes or NO_PREFIXES
    mapped = _root_form(prefixes.apply(full))
    root = _root_form(root_url)
    if not mapped.startswith(root + "/"):
        hint = "" if prefixes.pairs else " (map it onto your copy with --map-prefix FROM=TO)"
        raise LayoutError(f"path {full!r} is not under the source root {root_url!r}{hint}")
    return mapped[len(root) + 1 :]


def iter_table(data: bytes, name: str, batch_rows: int = 128) -> Iterator[dict[str, str]]:
    """Rows of a parquet, CSV or gzip-compressed CSV table, every value as a string, one at a
    time: a parquet table is decoded ``batch_rows`` rows at a time and a CSV read as a stream,
    so a plate's table never sits in memory as Python rows (a 3,456-field plate's would be
    ~20 MB of dicts)."""
    if name.endswith(".parquet"):
        yield from _parquet_rows(data, name, batch_rows)
        return
    text: IO[str] = (
        gzip.open(io.BytesIO(data), "rt", encoding="utf-8-sig", newline="")  # noqa: SIM115
        if name.endswith(".gz")
        else io.TextIOWrapper(io.BytesIO(data), encoding="utf-8-sig", newline="")
    )
    with text:
        try:
            yield from csv.DictReader(text)
        except (OSError, EOFError) as exc:
            raise LayoutError(f"{name}: not a readable gzip file: {exc}") from None
        except UnicodeDecodeError as exc:
            raise LayoutError(f"{name}: not a UTF-8 CSV table: {exc}") from None


def _parquet_rows(data: bytes, name: str, batch_rows: int) -> Iterator[dict[str, str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # A row group decodes whole (its dictionary pages hold every file name: ~2 KB a field);
    # Arrow's default pool would keep those pages, and take them from far larger segments, and
    # its I/O threads' pages could not be given back: the build's peak grew with its plate's
    # fields. So: malloc (``heap``), in this thread.
    with arrow_system_pool():
        try:
            table = pq.ParquetFile(io.BytesIO(data), pre_buffer=False)
            for batch in table.iter_batches(batch_size=batch_rows, use_threads=False):
                for row in batch.to_pylist():
                    yield {k: "" if v is None else str(v) for k, v in row.items()}
        except (pa.ArrowException, OSError) as exc:
            raise LayoutError(f"{name}: not a readable parquet table: {exc}") from None


def read_table(data: bytes, name: str) -> list[dict[str, str]]:
    """Every row of a table (``iter_table``) at once: for the small metadata tables."""
    return list(iter_table(data, name))


def _channel_columns(header: Sequence[str], kind: str, name: str) -> dict[str, tuple[str, ...]]:
    """Per channel, the columns naming its ``kind`` (Orig/Illum) file: ``(URL,)``,
    ``(PathName, FileName)`` or both; {} when the table has none of them for this kind."""
    out: dict[str, tuple[str, ...]] = {}
    for c in CHANNELS:
        url = next(
            (
                u
                for u in (f"URL_{kind}{c}", *([f"URL_{c}"] if kind == "Orig" else []))
                if u in header
            ),
            "",
        )
        pair = (f"PathName_{kind}{c}", f"FileName_{kind}{c}")
        has_pair = all(p in header for p in pair)
        out[c] = ((url,) if url else ()) + (pair if has_pair else ())
    if not any(out.values()):
        return {}
    missing = [
        f"URL_{kind}{c} or FileName_{kind}{c}+PathName_{kind}{c}" for c, v in out.items() if not v
    ]
    if missing:
        raise LayoutError(f"{name}: missing column(s) {', '.join(missing)}")
    return out


def _locate(row: dict[str, str], columns: tuple[str, ...], root: str, prefixes: PrefixMap) -> str:
    """The object a row names through ``columns``; both forms given must agree."""
    names = []
    if len(columns) in (1, 3):
        names.append((columns[0], relative_name(row[columns[0]], "", root, prefixes)))
    if len(columns) >= 2:
        path, file = columns[-2], columns[-1]
        names.append((f"{path}+{file}", relative_name(row[path], row[file], root, prefixes)))
    if len({n for _, n in names}) > 1:
        (a, x), (b, y) = names
        raise LayoutError(f"column {a} names {x!r} but {b} names {y!r}")
    return names[0][1]


def parse_load_data(
    rows: Iterable[dict[str, str]], name: str, root_url: str, prefixes: PrefixMap | None = None
) -> list[FieldRow]:
    """The fields a load-data table lists; LayoutError names the table, row and column."""
    return list(iter_load_data(rows, name, root_url, prefixes))


def iter_load_data(
    rows: Iterable[dict[str, str]], name: str, root_url: str, prefixes: PrefixMap | None = None
) -> Iterator[FieldRow]:
    """``parse_load_data`` one field at a time. What rows repeat (names of the source, batch and
    plate, a plate's illumination files) is one object shared by every row that names it."""
    it = iter(rows)
    first = next(it, None)
    if first is None:
        raise LayoutError(f"{name}: the load-data table lists no fields")
    header = list(first)
    missing = [c for c in ("Metadata_Plate", "Metadata_Well", "Metadata_Site") if c not in header]
    orig = _channel_columns(header, "Orig", name)
    if not orig:
        missing += [f"URL_Orig{c} or FileName_Orig{c}+PathName_Orig{c}" for c in CHANNELS]
    if missing:
        raise LayoutError(f"{name}: missing column(s) {', '.join(missing)}")
    illum_cols = _channel_columns(header, "Illum", name)
    prefixes = prefixes or NO_PREFIXES
    shared: dict[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = {}
    for n, row in enumerate(itertools.chain([first], it), start=2):  # row 1 is the header
        column = "Metadata_Site"
        try:
            site = int(float(row["Metadata_Site"]))
            images = []
            for c in CHANNELS:
                column = "/".join(orig[c])
                images.append((c, _locate(row, orig[c], root_url, prefixes)))
            illum = []
            for c in CHANNELS if illum_cols else ():
                column = "/".join(illum_cols[c])
                illum.append((c, _locate(row, illum_cols[c], root_url, prefixes)))
            column = "Metadata_Well"
            well = normalize_well(row["Metadata_Well"])
            column = "Metadata_Plate"
            plate = row["Metadata_Plate"].strip()
            if not plate:
                raise LayoutError("empty plate name")
            key = tuple(illum)
            yield FieldRow(
                source=sys.intern(row.get("Metadata_Source", "") or "source"),
                batch=sys.intern(row.get("Metadata_Batch", "") or ""),
                plate=sys.intern(plate),
                well=sys.intern(well),
                site=site,
                images=tuple(images),
                illum=shared.setdefault(key, key),
            )
        except (LayoutError, ValueError, KeyError, TypeError) as exc:
            raise LayoutError(f"{name}: row {n}: column {column}: {exc}") from None


def write_csv(rows: list[dict[str, object]]) -> bytes:
    """A CSV table (header from the first row's keys)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue().encode("utf-8")


def write_parquet(rows: list[dict[str, object]]) -> bytes:
    """A parquet table of the same rows (the release's ``load_data_with_illum.parquet``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()
