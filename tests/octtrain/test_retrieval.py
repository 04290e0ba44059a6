"""Retrieval mAP (copairs, ``eval/cellpainting/retrieval.py``) on profiles whose right answer is
known."""

from __future__ import annotations

import numpy as np

from octtrain.eval.cellpainting.profiles import WellKey
from octtrain.eval.cellpainting.retrieval import retrieval, retrieval_map


def _wells(plates: int = 3) -> list[WellKey]:
    out = []
    for p in range(plates):
        for w, pert in enumerate(["DMSO", "DMSO", "a", "b"]):
            out.append(WellKey(f"P{p}", f"W{w}", pert, pert == "DMSO"))
    return out


def test_map_is_high_when_replicates_separate_and_chance_when_they_do_not() -> None:
    wells = _wells()
    rng = np.random.default_rng(0)
    centres = {"DMSO": np.zeros(8), "a": np.eye(8)[0] * 5, "b": np.eye(8)[1] * 5}
    good = np.stack([centres[w.perturbation] + rng.normal(0, 0.3, 8) for w in wells])
    noise = rng.normal(0, 1, (len(wells), 8))
    separated, mixed = retrieval_map(good, wells), retrieval_map(noise, wells)
    assert separated["activity_map"] > 0.95 and separated["distinctiveness_map"] > 0.95
    assert separated["activity_retrieved"] == 1.0
    assert mixed["activity_map"] < 0.8 and mixed["activity_retrieved"] < 1.0
    assert not any("consistency" in k for k in separated)  # JUMP's name: distinctiveness


def test_distinctiveness_ranks_against_other_perturbations_not_controls() -> None:
    wells = _wells()
    rng = np.random.default_rng(1)
    # a and b share one phenotype, away from the controls: active, not distinct.
    centres = {"DMSO": np.zeros(8), "a": np.eye(8)[0] * 5, "b": np.eye(8)[0] * 5}
    x = np.stack([centres[w.perturbation] + rng.normal(0, 0.3, 8) for w in wells])
    m = retrieval_map(x, wells)
    assert m["activity_map"] > 0.95 and m["distinctiveness_map"] < 0.8


def test_retrieval_keeps_per_well_aps_of_treated_wells_only() -> None:
    wells = _wells()
    x = np.random.default_rng(3).normal(size=(len(wells), 6))
    r = retrieval(x, wells)
    ap = r.aps["activity"]
    assert ap is not None and set(ap["perturbation"]) == {"a", "b"} and len(ap) == 6


def test_distinctiveness_negatives_are_the_same_plates_other_perturbations_as_jumps() -> None:
    # a's replicates are each plate's nearest well, but b and c lie near a only on other plates:
    # a plate's own negatives (JUMP's nonrep: neg_sameby Metadata_Plate) never outrank a, the
    # pooled ones would.
    wells = [
        WellKey("P0", "W0", "a", False),
        WellKey("P0", "W1", "b", False),
        WellKey("P1", "W0", "a", False),
        WellKey("P1", "W1", "c", False),
    ]
    x = np.array([[1.0, 0.0, 0.1], [0.0, 1.0, 0.0], [0.8, 0.6, 0.0], [1.0, 0.0, 0.3]])
    ap = retrieval(x, wells).aps["distinctiveness"]
    assert ap is not None
    a = ap[ap["perturbation"] == "a"]["average_precision"]
    assert (a == 1.0).all()  # pooled: P1's c outranks a's replicate for P0's a (AP 0.5)
