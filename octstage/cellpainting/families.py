"""The twin's phenotype families: which perturbations a twin holds, and what each changes.

* ``named`` (``synth.PHENOTYPES``): DMSO, a strong positive control and four subtle changes of
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

from octstage.cellpainting.cells import Phenotype

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


def family_of(perturbation: str, named: set[str]) -> str:
    """The family of a perturbation id (``named``: the ids of ``synth.PHENOTYPES``)."""
    if perturbation in LEARNED:
        return "learned"
    return "named" if perturbation in named else "library"
