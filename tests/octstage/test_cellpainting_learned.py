"""The twin's learned family (``families.LEARNED``, ``arrangement.py``): each kind is drawn (a
targeted measure of where the stain lies moves the documented way), at the control's amount
(the same stain in the same cells), and the earlier phenotypes keep their bytes. That per-crop
statistics and the handcrafted set stay at chance on them is ``tests/octtrain``'s
``test_learned_twin_chance.py`` (it needs octtrain's measures)."""

from __future__ import annotations

import gzip
import hashlib
import io
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest

from octstage.cellpainting import families, synth
from octstage.cellpainting.arrangement import responds
from octstage.cellpainting.cells import CONTROL, Phenotype, draw_field
from octstage.cellpainting.families import LEARNED, family_of, twin_families
from octstage.cellpainting.metadata import DMSO, TABLES
from octstage.cli import main

SIZE = 192  # one cell a field: large enough that a binary mask's area and outline are not pixels


def _inside(seed: int) -> bool:
    """Whether the one cell of ``_cell(seed, ...)`` lies a fifth of the field from every edge:
    the field's edge would cut a cell's stain there, and it cuts an arrangement's differently
    from DMSO's."""
    centre = np.random.default_rng(seed).uniform(0.08, 0.92, size=2) * SIZE
    return bool((centre >= 0.2 * SIZE).all() and (centre <= 0.8 * SIZE).all())


SEEDS = [seed for seed in range(40) if _inside(seed)][:12]
# draw_field over families.PHENOTYPES (fresh default_rng([4, 2]) each, 96 px, 6 cells), the bytes
# concatenated in PHENOTYPES order, as drawn before the learned family existed (commit aa58242).
GOLDEN = "f630da8baad46d6ee3b4cbb96f2e057ed31aee7ff838358fb846ce70784e344c"


def test_the_earlier_phenotypes_keep_their_bytes() -> None:
    digest = hashlib.sha256()
    for _, phenotype, _ in families.PHENOTYPES.values():
        digest.update(draw_field(np.random.default_rng([4, 2]), 96, phenotype, 6).tobytes())
    assert digest.hexdigest() == GOLDEN


def _cell(seed: int, phenotype: Phenotype) -> tuple[np.ndarray, float, float]:
    """A noise-free field of one cell, and that cell's centre (the field's first draw)."""
    cy, cx = np.random.default_rng(seed).uniform(0.08, 0.92, size=2) * SIZE
    return draw_field(np.random.default_rng(seed), SIZE, phenotype, 1), float(cy), float(cx)


def _distance(image: np.ndarray, cy: float, cx: float) -> float:
    """The intensity-weighted mean distance of ``image`` from (cy, cx)."""
    yy, xx = np.mgrid[0 : image.shape[0], 0 : image.shape[1]]
    return float((np.hypot(yy - cy, xx - cx) * image).sum() / image.sum())


def _coherence(image: np.ndarray, cy: float, cx: float) -> float:
    """How much of ``image``'s gradient energy shares one orientation (the structure tensor's
    coherence, 0 isotropic .. 1 one direction) in the annulus 12..17 px from the cell's centre:
    beyond the largest nucleus and inside the smallest membrane at this size, where fibres run
    uncut."""
    gy, gx = np.gradient(image.astype(np.float64))
    yy, xx = np.mgrid[0 : image.shape[0], 0 : image.shape[1]]
    ring = (np.hypot(yy - cy, xx - cx) >= 12) & (np.hypot(yy - cy, xx - cx) <= 17)
    gy, gx = gy * ring, gx * ring
    jyy, jxx, jxy = (gy * gy).sum(), (gx * gx).sum(), (gx * gy).sum()
    return float(np.hypot(jxx - jyy, 2 * jxy) / (jxx + jyy))


def _solidity(image: np.ndarray) -> float:
    """Area over convex-hull area of ``image``'s largest component above half its peak."""
    mask = (image > 0.5 * image.max()).astype(np.uint8)
    contours, _ = cv2.findContours(mask, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
    largest = max(contours, key=cv2.contourArea)
    return float(cv2.contourArea(largest) / cv2.contourArea(cv2.convexHull(largest)))


def _fine(image: np.ndarray) -> float:
    """The share of ``image``'s energy at fine scale (its Laplacian's, over its own)."""
    lap = cv2.Laplacian(image.astype(np.float64), cv2.CV_64F)
    return float((lap**2).sum() / (image.astype(np.float64) ** 2).sum())


# kind -> (channel, measure, whether the phenotype raises it); each LEARNED id but the
# subpopulation (its own test below).
MEASURES: dict[str, tuple[int, Callable[[np.ndarray, float, float], float], bool]] = {
    "JCP2022_200001": (3, _distance, False),  # Mito nearer the nucleus
    "JCP2022_200002": (1, _coherence, True),  # AGP fibres parallel
    "JCP2022_200003": (0, lambda im, cy, cx: _solidity(im), False),  # DNA lobed
    "JCP2022_200004": (2, lambda im, cy, cx: _fine(im), True),  # ER a fine network
    "JCP2022_200005": (4, _distance, True),  # nucleoli toward the rim
}


@pytest.mark.parametrize("kind", sorted(MEASURES))
def test_each_learned_kind_moves_its_measure_at_the_controls_stain(kind: str) -> None:
    channel, measure, raises = MEASURES[kind]
    phenotype = LEARNED[kind][1]
    moved = 0
    for seed in SEEDS:
        control, cy, cx = _cell(seed, CONTROL)
        changed, _, _ = _cell(seed, phenotype)
        a = measure(control[channel], cy, cx)
        b = measure(changed[channel], cy, cx)
        moved += (b > a) if raises else (b < a)
        # the same amount of stain: the channel's total within 4% of the control cell's
        total = float(changed[channel].sum()) / float(control[channel].sum())
        assert abs(total - 1.0) < 0.04, (kind, seed, total)
        # and the other channels where they were (nothing else of the cell moved), but those
        # that follow a lobed nucleus's outline (AGP's fibres and RNA's, in its cytoplasm)
        kept = (2, 3) if kind == "JCP2022_200003" else [c for c in range(5) if c != channel]
        for c in kept:
            np.testing.assert_array_equal(changed[c], control[c], err_msg=f"{kind} {c}")
    assert moved == len(SEEDS), (kind, moved)


def test_a_reticular_er_has_the_diffuse_rings_mean_and_spread() -> None:
    phenotype = LEARNED["JCP2022_200004"][1]
    for seed in SEEDS:
        control, _, _ = _cell(seed, CONTROL)
        changed, _, _ = _cell(seed, phenotype)
        assert float(changed[2].mean()) == pytest.approx(float(control[2].mean()), rel=0.01)
        assert float(changed[2].std()) == pytest.approx(float(control[2].std()), rel=0.02)


def test_a_lobed_nucleus_keeps_its_area() -> None:
    phenotype = LEARNED["JCP2022_200003"][1]
    for seed in SEEDS:
        control, _, _ = _cell(seed, CONTROL)
        changed, _, _ = _cell(seed, phenotype)
        a, b = (float((f[0] > 0.5 * f[0].max()).sum()) for f in (control, changed))
        assert b == pytest.approx(a, rel=0.04), seed


def test_a_subpopulation_responds_in_its_share_of_cells_and_the_rest_are_dmso() -> None:
    rng = np.random.default_rng(0)
    positions = rng.uniform(0.08, 0.92, size=(4000, 2)) * 128
    share = np.mean([responds(float(y), float(x), 0.25) for y, x in positions])
    assert 0.22 < share < 0.28
    assert all(responds(float(y), float(x), 1.0) for y, x in positions[:50])
    # a field of many cells: some respond (their Mito moved), some do not
    phenotype = LEARNED["JCP2022_200006"][1]
    assert 0.2 <= phenotype.responders <= 0.3
    full = Phenotype(**{**vars(phenotype), "responders": 1.0})
    none = Phenotype(**{**vars(phenotype), "responders": 0.0})
    field = draw_field(np.random.default_rng(5), 256, phenotype, 24)
    np.testing.assert_array_equal(
        draw_field(np.random.default_rng(5), 256, none, 24),
        draw_field(np.random.default_rng(5), 256, CONTROL, 24),
    )
    assert not np.array_equal(field, draw_field(np.random.default_rng(5), 256, CONTROL, 24))
    assert not np.array_equal(field, draw_field(np.random.default_rng(5), 256, full, 24))


def test_the_family_is_its_own_ids_in_jumps_compound_range() -> None:
    named = set(families.PHENOTYPES)
    assert len(LEARNED) >= 6
    assert all(kind == "compound" for kind, _, _ in LEARNED.values())
    assert not set(LEARNED) & set(synth.library(0, 87))
    assert {family_of(p) for p in LEARNED} == {"learned"}
    assert family_of(next(iter(named))) == "named"
    assert family_of("JCP2022_100001") == "library"
    # families only for a twin with the learned family; real plates (named ids are JUMP's) none
    assert twin_families(named) == {}
    lib = synth.library(3, 2, learned=True)
    assert twin_families(lib) == {
        "named": sorted(named - {DMSO}),
        "library": ["JCP2022_100001", "JCP2022_100002"],
        "learned": sorted(LEARNED),
    }
    assert synth.library(3, 5, learned=True) == {**synth.library(3, 5), **LEARNED}


def test_a_learned_twin_lists_the_family_and_a_plain_one_is_as_before(tmp_path: Path) -> None:
    args = ["--plates", "1", "--sites", "1", "--size", "32", "--no-traps"]
    assert main(["synth", "--kind", "cellpainting", *args, "--learned", str(tmp_path / "l")]) == 0
    meta = tmp_path / "l" / synth.METADATA_DIR

    def table(name: str) -> pd.DataFrame:
        return pd.read_csv(io.BytesIO(gzip.decompress((meta / TABLES[name]).read_bytes())))

    assert set(LEARNED) <= set(table("compound")["Metadata_JCP2022"])
    wells = table("well")["Metadata_JCP2022"]
    assert all((wells == p).sum() == 4 for p in LEARNED)
    assert "learned=True" in (tmp_path / "l" / synth.MARKER).read_text()
    assert main(["synth", "--kind", "cellpainting", *args, str(tmp_path / "p")]) == 0
    assert "learned" not in (tmp_path / "p" / synth.MARKER).read_text()


def test_learned_is_refused_for_the_oct_twin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["synth", "--kind", "oct", "--learned", str(tmp_path / "t")]) == 2
    assert "--learned: only for --kind cellpainting" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()
