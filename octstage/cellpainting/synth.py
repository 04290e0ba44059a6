"""The synthetic Cell Painting twin, written as the Cell Painting Gallery releases JUMP.

Same seed, same bytes. ``generate(out)`` writes two trees:

- ``out/cpg0016-jump/<source>/`` (upload it to ``s3://cellpainting-gallery/cpg0016-jump/``):
  ``plates`` plates dealt in turn to an Opera Phenix source (``source_4``), a CV8000 source
  (``source_10``, whose action and channel numbers differ), a Phenix source whose folders say
  ``Measurement 1`` (``source_3``) and an ImageXpress source (``source_8``): every microscope
  of the release, with the image keys each writes (``microscopes.py``) under
  ``images/<batch>/images/``; the plate's illumination functions under
  ``images/<batch>/illum/<plate>/``; and per plate
  ``workspace/load_data_csv/<batch>/<plate>/load_data_with_illum.parquet`` and ``.csv`` with the
  release's columns: ``Metadata_{Source,Batch,Plate,Well,Site}``, ``FileName_Orig<Ch>``,
  ``PathName_Orig<Ch>`` (``s3://`` folders), ``URL_Orig<Ch>`` (``s3://`` URLs, as jump-portrait
  reads them), ``FileName_Illum<Ch>``, ``PathName_Illum<Ch>``;
- ``out/datasets/metadata/``: the jump-cellpainting ``datasets`` repository's tables for these
  plates: ``plate.csv.gz``, ``well.csv.gz`` (Source/Plate/Well/JCP2022), ``compound.csv.gz``,
  ``orf.csv.gz``, ``crispr.csv.gz``, ``perturbation_control.csv``, ``microscope_config.csv``
  (the release's columns, ``Metadata_Source`` as ``source_4``).

Each plate is a 4 x 6 block of wells (A01..D06) with ``sites`` fields per well, ``size`` x
``size`` pixels, five 16-bit TIFFs per field. Every perturbation of ``PHENOTYPES`` is in 4 wells
per plate, placed at random (so a well's position says nothing): DMSO (``JCP2022_033924``, the
negative control), AMG900 (``JCP2022_037716``, a positive control) and compounds, an ORF and a
CRISPR guide with ids in their own JCP2022 ranges, each changing morphology as documented there.
``compounds`` adds a library of that many more compounds (``library``), each a subtle change of
one or two features drawn from the seed; the plate is then a 384-well plate (16 x 24) whose first
wells hold them, with DMSO in 4x as many wells as each compound. An evaluation's intervals shrink
with the number of perturbations it averages over: five cannot tell mAP 0.72 from 0.76, a few
dozen can.
Every field is multiplied by its channel's illumination (a vignette; the illum ``.npy`` undoes
it, up to the plate's residual: its true vignette's peak is shifted) and a plate gain (a batch
effect, 0.8..1.2), plus the nuisance of ``cells.py`` (per well: stain intensity per channel, cell
density; per field: focus, background) and Poisson noise. One phenotype is strong, four subtle.
With ``learned`` the six of the learned family join them (``families.py``: changes of
arrangement at DMSO's intensity, area and pixel spread, on a 384-well plate).
With ``traps`` one TIFF (the second plate, its last well, site 1, Mito) is truncated: build-cache
must reject that field with the reason, and nothing else.
"""

from __future__ import annotations

import gzip
import io
import shutil
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
from octstage.cellpainting.families import LEARNED, PHENOTYPES
from octstage.cellpainting.layout import LOAD_DATA_ROOT, write_csv, write_parquet
from octstage.cellpainting.metadata import DMSO, TABLES
from octstage.cellpainting.microscopes import CV8000, PHENIX, TWIN_MICROSCOPES, Microscope
from octstage.errors import ConfigError
from octstage.twins import MARKER as TWIN_MARKER
from octstage.twins import claim_twin

DATASET = "cpg0016-jump"
BUCKET = "cellpainting-gallery"
METADATA_DIR = "datasets/metadata"
# The marker of a folder synth made (``twins``); its text names the kind and the parameters,
# so neither twin clears the other, and another twin is replaced only with --overwrite.
MARKER = TWIN_MARKER
ROWS, COLS = "ABCD", 6
PLATE_384 = "ABCDEFGHIJKLMNOP", 24  # the layout once a library needs more than 24 wells
WELLS_PER_PERTURBATION = 4
Library = dict[str, tuple[str, Phenotype, str]]
# A library compound changes one or two of these by a factor drawn log-uniform in
# [LIBRARY_STRENGTH]: at most ``cap`` up or down (sizes move less than counts, as in real screens,
# where a compound that shrinks cells by a third is toxic rather than subtle). The low end sits
# inside the well-to-well nuisance (stain sd 0.15), so some library APs stay low for every encoder.
LIBRARY_STRENGTH = (0.08, 1.0)  # share of ``cap`` (log scale)
LIBRARY_FEATURES = {  # feature -> its cap (log of the largest factor)
    "nucleus_size": 0.35,
    "cell_size": 0.2,
    "mito_count": 0.9,
    "er_spread": 0.35,
    "agp_membrane": 0.4,
    "nucleoli": 0.6,
}
CONTROL_SHARE = 4  # a library plate's DMSO wells per compound's wells
LIBRARY_FIRST_ID = 100001  # the library's JCP2022 ids count up from here (JUMP's compound range)


def library(seed: int, compounds: int, learned: bool = False) -> Library:
    """``PHENOTYPES`` plus ``compounds`` compounds drawn from ``seed``: each changes one or two
    features of ``LIBRARY_FEATURES``, up or down, by a strength drawn in ``LIBRARY_STRENGTH``;
    with ``learned``, the learned family (``families.LEARNED``) after them."""
    out = dict(PHENOTYPES)
    names = sorted(LIBRARY_FEATURES)
    for i in range(compounds):
        rng = np.random.default_rng([seed, 29, i])
        chosen = rng.choice(names, size=int(rng.integers(1, 3)), replace=False)
        change = {}
        for name in sorted(str(c) for c in chosen):
            share = float(np.exp(rng.uniform(*np.log(LIBRARY_STRENGTH))))
            sign = 1.0 if rng.random() < 0.5 else -1.0
            change[name] = round(float(np.exp(sign * share * LIBRARY_FEATURES[name])), 3)
        what = ", ".join(f"{k} x{v:g}" for k, v in change.items())
        out[f"JCP2022_{LIBRARY_FIRST_ID + i:06d}"] = (
            "compound",
            Phenotype(**change),
            f"library compound: {what}",
        )
    if learned:
        out.update(LEARNED)
    return out


# Modality (which datasets table lists the id) of the controls above.
_CONTROL_MODALITY = {DMSO: "compound", "JCP2022_037716": "compound"}
_CONTROL_NAMES = {DMSO: "DMSO", "JCP2022_037716": "AMG900"}


@dataclass(frozen=True)
class TwinInfo:
    """What the twin holds (tests and the CLI summary read it)."""

    plates: tuple[str, ...]
    fields: int
    tiffs: int
    truncated: tuple[str, ...]  # object names (under the dataset root) of the planted bad TIFFs
    load_data: tuple[str, ...]  # object names of the load-data tables (parquet and CSV)
    metadata: str  # the datasets metadata folder, relative to ``out``
    dataset: str = DATASET  # the dataset root (upload it as s3://BUCKET/DATASET), under ``out``
    bucket: str = BUCKET
    sources: tuple[str, ...] = ()  # per plate, its source


def plate_map(
    seed: int,
    plate_index: int,
    replicates: int = WELLS_PER_PERTURBATION,
    perturbations: Library = PHENOTYPES,
) -> dict[str, str]:
    """well -> perturbation id: every perturbation in ``replicates`` wells (at most 4), at
    random places per plate (the first wells of the 4 x 6 block, row by row, or of a 384-well
    plate when they do not fit)."""
    # A library plate carries DMSO in 4x as many wells as a compound, as JUMP's compound plates
    # do (tens of DMSO wells of 384): the per-plate robust z-score and sphering need them.
    library_plate = len(perturbations) > len(PHENOTYPES)
    ids = [
        p
        for p in perturbations
        for _ in range(replicates * (CONTROL_SHARE if library_plate and p == DMSO else 1))
    ]
    rows, cols = (ROWS, COLS) if len(ids) <= len(ROWS) * COLS else PLATE_384
    if len(ids) > len(rows) * cols:
        learned = sum(p in LEARNED for p in perturbations)
        most = (len(rows) * cols) // replicates - CONTROL_SHARE - len(PHENOTYPES) + 1 - learned
        also = f" beside the {learned} of --learned" if learned else ""
        raise ConfigError(
            f"compounds {len(perturbations) - len(PHENOTYPES) - learned}: with {replicates} wells "
            f"each and DMSO in {CONTROL_SHARE * replicates}, at most {most} fit a 384-well "
            f"plate{also}"
        )
    wells = [f"{r}{c:02d}" for r in rows for c in range(1, cols + 1)][: len(ids)]
    order = np.random.default_rng([seed, plate_index, 17]).permutation(len(wells))
    return {wells[i]: ids[k] for k, i in enumerate(order)}


def plate_name(index: int) -> str:
    """The twin's plate names, shaped like their sources' (BR00117035, Dest210531-152149,
    A1170383)."""
    scope = TWIN_MICROSCOPES[index % len(TWIN_MICROSCOPES)]
    if scope.name == PHENIX:
        return f"BR{117035 + index:08d}"
    return f"Dest{210531 + index}-152149" if scope.name == CV8000 else f"A{1170383 + index}"


def _tiff(image: np.ndarray) -> bytes:
    import tifffile

    buf = io.BytesIO()
    tifffile.imwrite(buf, image, photometric="minisblack")
    return buf.getvalue()


def _gz_csv(rows: list[dict[str, object]]) -> bytes:
    return gzip.compress(write_csv(rows), mtime=0)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _write_metadata(
    out: Path,
    plates: list[tuple[str, Microscope]],
    wells: list[dict[str, object]],
    perturbations: Library,
) -> None:
    """The datasets repository's tables for the twin's plates and wells."""
    by_type: dict[str, list[dict[str, object]]] = {"compound": [], "orf": [], "crispr": []}
    for jcp, (kind, _, what) in perturbations.items():
        modality = _CONTROL_MODALITY.get(jcp, kind)
        if modality == "compound":
            key = "".join(chr(65 + int(d)) for d in jcp[-6:])
            row: dict[str, object] = {
                "Metadata_JCP2022": jcp,
                "Metadata_InChIKey": f"{key}TWINSYNTHX-UHFFFAOYSA-N",
                "Metadata_InChI": "",
                "Metadata_SMILES": "",
            }
        else:
            row = {"Metadata_JCP2022": jcp, "Metadata_NCBI_Gene_ID": "", "Metadata_Symbol": what}
        by_type[modality].append(row)
    for modality, rows in by_type.items():
        _write(out / TABLES[modality], _gz_csv(rows))
    controls: list[dict[str, object]] = [
        {
            "Metadata_JCP2022": jcp,
            "Metadata_pert_type": PHENOTYPES[jcp][0],
            "Metadata_Name": name,
            "Metadata_modality": "compound",
        }
        for jcp, name in _CONTROL_NAMES.items()
    ]
    _write(out / TABLES["control"], write_csv(controls))
    _write(out / TABLES["well"], _gz_csv(wells))
    plate_rows: list[dict[str, object]] = [
        {
            "Metadata_Source": m.source,
            "Metadata_Batch": m.batch,
            "Metadata_Plate": p,
            "Metadata_PlateType": "COMPOUND",
        }
        for p, m in plates
    ]
    _write(out / "plate.csv.gz", _gz_csv(plate_rows))
    scopes = {m.source: m for _, m in plates}
    config = [m.config_row() for m in scopes.values()]
    _write(out / "microscope_config.csv", write_csv(config))


def _claim(out: Path, marker: str, overwrite: bool) -> None:
    """``out`` new, empty, or a Cell Painting twin synth wrote (``twins.claim_twin``: other
    parameters need ``overwrite``; its trees cleared first, so no file of a larger earlier twin
    stays): never someone else's folder, nor an OCT twin."""

    def clear() -> None:
        shutil.rmtree(out / DATASET, ignore_errors=True)
        shutil.rmtree(out / METADATA_DIR, ignore_errors=True)

    claim_twin(out, marker, overwrite, clear, "--kind cellpainting")


def generate(
    out: Path,
    plates: int = 2,
    sites: int = 3,
    size: int = 128,
    seed: int = 0,
    traps: bool = True,
    replicates: int = WELLS_PER_PERTURBATION,
    bucket: str = BUCKET,
    compounds: int = 0,
    overwrite: bool = False,
    learned: bool = False,
) -> TwinInfo:
    """Write the twin under ``out`` (see the module doc); ``replicates`` wells per
    perturbation and plate (1..4; tests use fewer to stay fast); ``bucket``: the bucket the
    tables' ``s3://`` URLs name (the twin's tree goes to ``s3://<bucket>/cpg0016-jump/``);
    ``compounds``: library compounds beside ``PHENOTYPES`` (``library``); ``learned``: the
    learned family too (``families.py``); ``overwrite``: replace a twin of other parameters
    there (``twins``)."""
    if not (
        1 <= replicates <= WELLS_PER_PERTURBATION
        and size >= 32
        and plates >= 1
        and sites >= 1
        and compounds >= 0
    ):
        raise ConfigError(
            "twin needs 1..4 replicates, size >= 32, at least one plate and site, compounds >= 0"
        )
    perturbations = library(seed, compounds, learned)
    plate_map(seed, 0, replicates, perturbations)  # refuses a library too big before writing
    _claim(
        out,
        f"kind=cellpainting seed={seed} plates={plates} sites={sites} size={size} "
        f"replicates={replicates} compounds={compounds} traps={traps} bucket={bucket}"
        # Added only when set: a twin written before the family existed keeps its marker.
        + (" learned=True" if learned else "")
        + "\n",
        overwrite,
    )
    root = out / DATASET
    root.mkdir(parents=True, exist_ok=True)
    well_rows: list[dict[str, object]] = []
    load_data: list[str] = []
    truncated: list[str] = []
    n_fields = 0
    plate_names = tuple(plate_name(i) for i in range(plates))
    scopes = [TWIN_MICROSCOPES[i % len(TWIN_MICROSCOPES)] for i in range(plates)]
    for pi, (plate, scope) in enumerate(zip(plate_names, scopes, strict=True)):
        rng = np.random.default_rng([seed, pi])
        gain = float(rng.uniform(0.8, 1.2))
        illum = np.stack([illumination(size, k) for k in range(len(CHANNEL_ORDER))])
        shift = (float(rng.uniform(-0.08, 0.08)), float(rng.uniform(-0.08, 0.08)))
        true_illum = np.stack([illumination(size, k, shift) for k in range(len(CHANNEL_ORDER))])
        src = f"{scope.source}/"
        folder = scope.folder(plate, pi)
        img_dir = f"{src}images/{scope.batch}/images/{folder}"
        illum_dir = f"{src}images/{scope.batch}/illum/{plate}"
        url = f"s3://{bucket}/{DATASET}/"
        for k, ch in enumerate(CHANNEL_ORDER):
            # CellProfiler's illum function: mean 1 over the image, divide to flatten.
            buf = io.BytesIO()
            np.save(buf, illum[k] / illum[k].mean())
            _write(root / illum_dir / f"{plate}_Illum{ch}.npy", buf.getvalue())
        rows: list[dict[str, object]] = []
        wells = plate_map(seed, pi, replicates, perturbations)
        for wi, (well, pert) in enumerate(sorted(wells.items())):
            _, phenotype, _ = perturbations[pert]
            well_rows.append(
                {
                    "Metadata_Source": scope.source,
                    "Metadata_Plate": plate,
                    "Metadata_Well": well,
                    "Metadata_JCP2022": pert,
                }
            )
            r, c = PLATE_384[0].index(well[0]) + 1, int(well[1:])
            nuisance = Nuisance.of_well(rng)
            for site in range(1, sites + 1):
                field = draw_field(rng, size, phenotype, cells=int(rng.integers(*nuisance.cells)))
                raw = to_uint16(rng, field, true_illum, gain, nuisance.stain)
                row: dict[str, object] = {
                    "Metadata_Source": scope.source,
                    "Metadata_Batch": scope.batch,
                    "Metadata_Plate": plate,
                    "Metadata_Well": well,
                    "Metadata_Site": site,
                }
                urls: dict[str, object] = {}
                for k, ch in enumerate(CHANNEL_ORDER):
                    name = scope.file_name(folder.removesuffix("/Images"), r, c, site, ch)
                    data = _tiff(raw[k])
                    if traps and pi == 1 and wi == len(wells) - 1 and site == 1 and ch == "Mito":
                        data = data[: len(data) // 2]  # a half-uploaded file
                        truncated.append(f"{img_dir}/{name}")
                    _write(root / img_dir / name, data)
                    row[f"FileName_Orig{ch}"] = name
                    row[f"PathName_Orig{ch}"] = f"{url}{img_dir}/"
                    urls[f"URL_Orig{ch}"] = f"{url}{img_dir}/{name}"
                for ch in CHANNEL_ORDER:
                    row[f"FileName_Illum{ch}"] = f"{plate}_Illum{ch}.npy"
                    row[f"PathName_Illum{ch}"] = f"{url}{illum_dir}/"
                rows.append({**row, **urls})
                n_fields += 1
        table = f"{src}{LOAD_DATA_ROOT}{scope.batch}/{plate}/load_data_with_illum"
        _write(root / f"{table}.parquet", write_parquet(rows))
        _write(root / f"{table}.csv", write_csv(rows))
        load_data += [f"{table}.parquet", f"{table}.csv"]
    _write_metadata(
        out / METADATA_DIR, list(zip(plate_names, scopes, strict=True)), well_rows, perturbations
    )
    return TwinInfo(
        plate_names,
        n_fields,
        n_fields * len(CHANNEL_ORDER),
        tuple(truncated),
        tuple(load_data),
        METADATA_DIR,
        bucket=bucket,
        sources=tuple(m.source for m in scopes),
    )


def run_synth_cellpainting(
    out: Path,
    plates: int,
    sites: int,
    size: int,
    seed: int,
    traps: bool,
    compounds: int = 0,
    overwrite: bool = False,
    learned: bool = False,
) -> int:
    """CLI: write the twin and say what it holds."""
    console = Console(stderr=True)
    with console.status(f"writing the Cell Painting twin into {out}"):
        info = generate(
            out,
            plates,
            sites,
            size,
            seed,
            traps,
            compounds=compounds,
            overwrite=overwrite,
            learned=learned,
        )
    console.print(
        f"octstage synth --kind cellpainting: {out}: {len(info.plates)} plates "
        f"({', '.join(f'{p} of {s}' for p, s in zip(info.plates, info.sources, strict=True))}), "
        f"{info.fields} fields, {info.tiffs} TIFFs ({size}x{size}, uint16), "
        f"{len(info.truncated)} planted truncated TIFF(s)\n"
        f"  the bucket's tree: {out / info.dataset} (upload it as s3://{info.bucket}/{info.dataset})"
        f"\n  the datasets repository's tables: {out / info.metadata}"
    )
    for pert, (kind, _, what) in library(seed, compounds, learned).items():
        console.print(f"  {pert:16s} {kind:9s} {what}")
    return 0
