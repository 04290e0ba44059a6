"""The Cell Painting twin's nuisance (``cells.py``): what a random encoder must see through, as
the generator's docstring promises it (per well stain and density, per field focus and
background, per plate a residual illumination), and its subtle phenotypes."""

from __future__ import annotations

import numpy as np

from octstage.cellpainting.cells import (
    CHANNEL_ORDER,
    STAIN_SD,
    Nuisance,
    Phenotype,
    changes,
    illumination,
    to_uint16,
)
from octstage.cellpainting.families import PHENOTYPES

C = len(CHANNEL_ORDER)


def test_a_well_s_stain_varies_per_channel_and_its_density_around_a_mean() -> None:
    rng = np.random.default_rng(0)
    wells = [Nuisance.of_well(rng) for _ in range(400)]
    log_stain = np.log(np.array([w.stain for w in wells]))
    assert log_stain.shape == (400, C)
    assert abs(float(log_stain.std()) - STAIN_SD) < 0.02 and STAIN_SD > 0.1
    lows = {w.cells[0] for w in wells}
    assert lows == {3, 4, 5, 6, 7} and all(w.cells[1] == w.cells[0] + 3 for w in wells)


def test_the_camera_applies_the_well_s_stain_channel_by_channel() -> None:
    field = np.ones((C, 32, 32), np.float32)
    flat = np.ones((C, 32, 32), np.float32)
    stain = (1.0, 2.0, 1.0, 1.0, 0.5)
    counts = to_uint16(np.random.default_rng(1), field, flat, 1.0, stain).astype(np.float64)
    means = counts.mean(axis=(1, 2))
    assert means[1] / means[0] > 1.8 and means[4] / means[0] < 0.6
    plain = to_uint16(np.random.default_rng(1), field, flat, 1.0).astype(np.float64)
    assert plain.mean(axis=(1, 2)).std() / plain.mean() < 0.01  # no stain: channels alike


def test_the_camera_blurs_some_fields_and_varies_the_background() -> None:
    field = np.zeros((C, 128, 128), np.float32)
    field[:, 16, 16] = 1.0  # one bright point
    flat = np.ones((C, 128, 128), np.float32)
    rng = np.random.default_rng(2)
    shots = [to_uint16(rng, field, flat, 1.0).astype(np.float64) for _ in range(20)]
    peaks = [s[0, 16, 16] for s in shots]
    assert max(peaks) > 2 * min(peaks)  # in focus the point keeps its counts, blurred it spreads
    backgrounds = [float(np.median(s[0])) for s in shots]
    assert max(backgrounds) - min(backgrounds) > 20.0


def test_a_shifted_illumination_leaves_a_residual_after_the_npy_s_correction() -> None:
    nominal = illumination(64, 2)
    true = illumination(64, 2, (0.08, -0.08))
    residual = true / nominal
    assert float(residual.max() / residual.min()) > 1.1
    assert np.array_equal(illumination(64, 2, (0.0, 0.0)), nominal)


def test_the_twin_has_one_strong_phenotype_and_subtle_ones_beside_the_control() -> None:
    def strength(p: Phenotype) -> float:
        return max((abs(float(np.log(v))) for v in changes(p).values()), default=0.0)

    levels = sorted(strength(p) for _, p, _ in PHENOTYPES.values())
    assert levels[0] == 0.0  # DMSO
    subtle = [s for s in levels[1:] if s < 0.5]  # within ~1.6x of the control
    assert len(subtle) == 4 and max(levels) >= np.log(1.4)
