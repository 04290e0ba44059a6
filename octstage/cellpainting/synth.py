"""The synthetic Cell Painting twin, written in JUMP's layout (see ``layout.py``).

Same seed, same bytes. ``plates`` plates (``P1``, ``P2``, ... of source ``source_0``, batch
``B1``), each a 4 x 6 block of wells (A01..D06) with ``sites`` fields per well, ``size`` x
``size`` pixels, five 16-bit TIFFs per field (DNA, AGP, ER, Mito, RNA; files named as the
Opera Phenix names them, ``r01c01f01p01-ch<k>sk1fk1fl1.tiff``, with a channel numbering the
load-data table maps), the plate's illumination functions as ``.npy`` and a load-data table
``load_data_with_illum.csv`` per plate; ``metadata/perturbations.csv`` is the perturbation table.

Each plate holds every perturbation of ``PHENOTYPES`` in 4 wells, placed at random per plate
(so a well's position says nothing): the negative control ``DMSO`` and five perturbations that
change morphology as documented there (one strong, four subtle). Every field is multiplied by
its channel's illumination (a vignette; the illum ``.npy`` undoes it, up to the plate's
residual: its true vignette's peak is shifted) and a plate gain (a batch effect, 0.8..1.2), plus
the nuisance of ``cells.py`` (per well: stain intensity per channel, cell density; per field:
focus, background) and Poisson noise. With ``traps`` one TIFF (plate P2, the last well, site 1,
Mito) is truncated: build-cache must reject that field with the reason, and nothing else.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console

from octstage.cellpainting.cells import (
    CHANNEL_ORDER,
    Nuisance,
    Phenotype,
    draw_field,
    illumination,
    to_uint16,
)
from octstage.cellpainting.layout import LOAD_DATA_ROOT, write_csv
from octstage.errors import ConfigError

SOURCE = "source_0"
BATCH = "B1"
ROWS, COLS = "ABCD", 6
WELLS_PER_PERTURBATION = 4
# id -> (perturbation type, phenotype, what changes; a probe should tell them apart). One strong
# phenotype and four subtle ones, so that encoders do not all score AP ~1: their sizes sit near
# the well-to-well nuisance of ``cells.py`` (stain intensity, cell density, focus), which a
# random encoder cannot see through.
PHENOTYPES: dict[str, tuple[str, Phenotype, str]] = {
    "DMSO": ("negcon", Phenotype(), "negative control"),
    "JCP2022_000001": ("compound", Phenotype(nucleus_size=1.45), "nuclei 45% larger (DNA)"),
    "JCP2022_000002": (
        "compound",
        Phenotype(mito_count=2.5),
        "mitochondria fragmented: 2.5x the puncta, smaller (Mito; subtle)",
    ),
    "JCP2022_000003": (
        "orf",
        Phenotype(er_spread=1.4),
        "ER spread 40% wider, dimmer (ER; subtle)",
    ),
    "JCP2022_000004": (
        "crispr",
        Phenotype(cell_size=0.9, agp_membrane=0.75),
        "cells 10% smaller, membrane/actin 25% fainter (AGP; subtle)",
    ),
    "JCP2022_000005": (
        "compound",
        Phenotype(nucleoli=1.5),
        "more nucleoli and cytoplasmic RNA, +50% (RNA; subtle)",
    ),
}
# Opera-Phenix-like channel numbers: the file's ch<k> is not the load-data column order.
CHANNEL_NUMBER = {"Mito": 1, "AGP": 2, "RNA": 3, "ER": 4, "DNA": 5}


@dataclass(frozen=True)
class TwinInfo:
    """What the twin holds (tests and the CLI summary read it)."""

    plates: tuple[str, ...]
    fields: int
    tiffs: int
    truncated: tuple[str, ...]  # object names of the planted bad TIFFs
    load_data: tuple[str, ...]  # object names of the load-data tables
    metadata: str  # object name of the perturbation table


def plate_map(
    seed: int, plate_index: int, replicates: int = WELLS_PER_PERTURBATION
) -> dict[str, str]:
    """well -> perturbation id: every perturbation in ``replicates`` wells (at most 4), at
    random places per plate (the first wells of the 4 x 6 block, row by row)."""
    ids = [p for p in PHENOTYPES for _ in range(replicates)]
    wells = [f"{r}{c:02d}" for r in ROWS for c in range(1, COLS + 1)][: len(ids)]
    order = np.random.default_rng([seed, plate_index, 17]).permutation(len(wells))
    return {wells[i]: ids[k] for k, i in enumerate(order)}


def _tiff(image: np.ndarray) -> bytes:
    import tifffile

    buf = io.BytesIO()
    tifffile.imwrite(buf, image, photometric="minisblack")
    return buf.getvalue()


def generate(
    out: Path,
    plates: int = 2,
    sites: int = 3,
    size: int = 128,
    seed: int = 0,
    traps: bool = True,
    replicates: int = WELLS_PER_PERTURBATION,
) -> TwinInfo:
    """Write the twin under ``out`` (the source root); ``replicates`` wells per perturbation
    and plate (1..4; tests use fewer to stay fast)."""
    if not (
        1 <= replicates <= WELLS_PER_PERTURBATION and size >= 32 and plates >= 1 and sites >= 1
    ):
        raise ConfigError("twin needs 1..4 replicates, size >= 32, at least one plate and site")
    out.mkdir(parents=True, exist_ok=True)
    metadata_rows: list[dict[str, object]] = []
    load_data: list[str] = []
    truncated: list[str] = []
    n_fields = 0
    plate_names = tuple(f"P{i + 1}" for i in range(plates))
    for pi, plate in enumerate(plate_names):
        rng = np.random.default_rng([seed, pi])
        gain = float(rng.uniform(0.8, 1.2))
        illum = np.stack([illumination(size, k) for k in range(len(CHANNEL_ORDER))])
        shift = (float(rng.uniform(-0.08, 0.08)), float(rng.uniform(-0.08, 0.08)))
        true_illum = np.stack([illumination(size, k, shift) for k in range(len(CHANNEL_ORDER))])
        img_dir = f"images/{BATCH}/images/{plate}"
        illum_dir = f"images/{BATCH}/illum/{plate}"
        (out / illum_dir).mkdir(parents=True, exist_ok=True)
        for k, ch in enumerate(CHANNEL_ORDER):
            # CellProfiler's illum function: mean 1 over the image, divide to flatten.
            np.save(out / illum_dir / f"{plate}_Illum{ch}.npy", illum[k] / illum[k].mean())
        (out / img_dir).mkdir(parents=True, exist_ok=True)
        rows: list[dict[str, object]] = []
        wells = plate_map(seed, pi, replicates)
        for wi, (well, pert) in enumerate(sorted(wells.items())):
            kind, phenotype, _ = PHENOTYPES[pert]
            metadata_rows.append(
                {
                    "Metadata_Source": SOURCE,
                    "Metadata_Plate": plate,
                    "Metadata_Well": well,
                    "Metadata_JCP2022": pert,
                    "Metadata_perturbation_type": kind,
                }
            )
            r, c = ROWS.index(well[0]) + 1, int(well[1:])
            nuisance = Nuisance.of_well(rng)
            for site in range(1, sites + 1):
                field = draw_field(rng, size, phenotype, cells=int(rng.integers(*nuisance.cells)))
                raw = to_uint16(rng, field, true_illum, gain, nuisance.stain)
                row: dict[str, object] = {
                    "Metadata_Source": SOURCE,
                    "Metadata_Batch": BATCH,
                    "Metadata_Plate": plate,
                    "Metadata_Well": well,
                    "Metadata_Site": site,
                }
                for k, ch in enumerate(CHANNEL_ORDER):
                    name = f"r{r:02d}c{c:02d}f{site:02d}p01-ch{CHANNEL_NUMBER[ch]}sk1fk1fl1.tiff"
                    data = _tiff(raw[k])
                    if traps and pi == 1 and wi == len(wells) - 1 and site == 1 and ch == "Mito":
                        data = data[: len(data) // 2]  # a half-uploaded file
                        truncated.append(f"{img_dir}/{name}")
                    (out / img_dir / name).write_bytes(data)
                    row[f"FileName_Orig{ch}"] = name
                    row[f"PathName_Orig{ch}"] = f"{img_dir}/"
                for ch in CHANNEL_ORDER:
                    row[f"FileName_Illum{ch}"] = f"{plate}_Illum{ch}.npy"
                    row[f"PathName_Illum{ch}"] = f"{illum_dir}/"
                rows.append(row)
                n_fields += 1
        table = f"{LOAD_DATA_ROOT}{BATCH}/{plate}/load_data_with_illum.csv"
        (out / table).parent.mkdir(parents=True, exist_ok=True)
        (out / table).write_bytes(write_csv(rows))
        load_data.append(table)
    metadata = "metadata/perturbations.csv"
    (out / metadata).parent.mkdir(parents=True, exist_ok=True)
    (out / metadata).write_bytes(write_csv(metadata_rows))
    return TwinInfo(
        plate_names,
        n_fields,
        n_fields * len(CHANNEL_ORDER),
        tuple(truncated),
        tuple(load_data),
        metadata,
    )


def run_synth_cellpainting(
    out: Path, plates: int, sites: int, size: int, seed: int, traps: bool
) -> int:
    """CLI: write the twin and say what it holds."""
    console = Console(stderr=True)
    with console.status(f"writing the Cell Painting twin into {out}"):
        info = generate(out, plates, sites, size, seed, traps)
    console.print(
        f"octstage synth --kind cellpainting: {out}: {len(info.plates)} plates, {info.fields} "
        f"fields, {info.tiffs} TIFFs ({size}x{size}, uint16), {len(info.truncated)} planted "
        f"truncated TIFF(s); perturbation table {info.metadata}"
    )
    for pert, (kind, _, what) in PHENOTYPES.items():
        console.print(f"  {pert:16s} {kind:9s} {what}")
    return 0
