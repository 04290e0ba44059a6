"""The twin's phenotype families: which perturbations a twin holds, and what each changes.

* ``named`` (``PHENOTYPES``): DMSO, a strong positive control and four subtle changes of
  amount (nucleus size, mitochondrial count, ER width, membrane brightness, nucleoli), each a
  per-cell multiplier: per-crop intensity statistics separate them, and so does a random
  network (issue 51's finding).
* ``library`` (``synth.library``): compounds changing one or two of those amounts.
* ``learned`` (``LEARNED``, with ``synth --learned``): six changes of arrangement at the
  control's amount (``arrangement.py``), as JUMP compounds produce them: perinuclear
  mitochondria, parallel actin fibres, lobed nuclei, a reticular ER, nucleoli at the nuclear
  rim, and a responding subpopulation. Each is built to leave per-crop intensity statistics
  and the handcrafted set at chance (their tests); what separates them from DMSO is where the
  stain lies, which an encoder has to learn.

A twin without ``--learned`` has the bytes it had before the family existed, so every earlier
figure stays comparable.
"""

from __future__ import annotations

from collections.abc import Collection

from octstage.cellpainting.cells import Phenotype
from octstage.cellpainting.metadata import DMSO

# id -> (perturbation type the build assigns, phenotype, what changes; a probe should tell them
# apart). Ids follow JUMP's numbering: compounds below 800000, CRISPR 8xxxxx, ORF 9xxxxx. One
# strong phenotype and four subtle ones, so that encoders do not all score AP ~1: their sizes sit
# near the well-to-well nuisance of ``cells.py`` (stain intensity, cell density, focus), which a
# random encoder cannot see through.
PHENOTYPES: dict[str, tuple[str, Phenotype, str]] = {
    DMSO: ("negcon", Phenotype(), "DMSO, the negative control"),
    "JCP2022_037716": (
        "poscon",
        Phenotype(nucleus_size=1.45),
        "AMG900 (positive control): nuclei 45% larger (DNA)",
    ),
    "JCP2022_012567": (
        "compound",
        Phenotype(mito_count=2.5),
        "mitochondria fragmented: 2.5x the puncta, smaller (Mito; subtle)",
    ),
    "JCP2022_904321": (
        "orf",
        Phenotype(er_spread=1.4),
        "ER spread 40% wider, dimmer (ER; subtle)",
    ),
    "JCP2022_801234": (
        "crispr",
        Phenotype(cell_size=0.9, agp_membrane=0.75),
        "cells 10% smaller, membrane/actin 25% fainter (AGP; subtle)",
    ),
    "JCP2022_047355": (
        "compound",
        Phenotype(nucleoli=1.5),
        "more nucleoli and cytoplasmic RNA, +50% (RNA; subtle)",
    ),
}

# id -> (perturbation type, phenotype, what changes). Ids in JUMP's compound range, apart from
# the library's (which counts up from 100001).
LEARNED: dict[str, tuple[str, Phenotype, str]] = {
    "JCP2022_200001": (
        "compound",
        Phenotype(mito_perinuclear=1.0),
        "mitochondria around the nucleus, same count and size (Mito; learned)",
    ),
    "JCP2022_200002": (
        "compound",
        Phenotype(actin_aligned=1.0),
        "actin fibres parallel within each cell, same count and length (AGP; learned)",
    ),
    "JCP2022_200003": (
        "compound",
        Phenotype(nucleus_lobes=0.2),
        "nuclei three-lobed at equal area and brightness (DNA; learned)",
    ),
    "JCP2022_200004": (
        "compound",
        Phenotype(er_reticular=1.0),
        "ER a tubular network at the diffuse ring's mean and sd (ER; learned)",
    ),
    "JCP2022_200005": (
        "compound",
        Phenotype(nucleoli_rim=1.0),
        "nucleoli at the nuclear rim, same count and size (RNA; learned)",
    ),
    "JCP2022_200006": (
        "compound",
        Phenotype(nucleus_lobes=0.25, mito_perinuclear=1.0, er_reticular=1.0, responders=0.25),
        "a quarter of the cells respond: lobed nuclei, perinuclear mitochondria, reticular ER "
        "(learned; a subpopulation)",
    ),
}
FAMILIES = ("named", "library", "learned")


def family_of(perturbation: str) -> str:
    """The family of one of the twin's perturbation ids (``FAMILIES``)."""
    if perturbation in LEARNED:
        return "learned"
    return "named" if perturbation in PHENOTYPES else "library"


def twin_families(perturbations: Collection[str]) -> dict[str, list[str]]:
    """family -> the ``perturbations`` in it (DMSO left out), for a twin written with
    ``--learned``; ``{}`` when no id of the learned family is among them. The named ids are
    real JUMP ids (DMSO, AMG900, ...) and the library's lie in JUMP's compound range, so only a
    learned id (``JCP2022_2000xx``, above every compound JUMP assigned) says the wells are the
    twin's: real plates get no families."""
    present = set(perturbations) - {DMSO}
    if not present & set(LEARNED):
        return {}
    out = {name: sorted(p for p in present if family_of(p) == name) for name in FAMILIES}
    return {name: ids for name, ids in out.items() if ids}
