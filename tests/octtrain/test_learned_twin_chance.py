"""The twin's learned family holds its construction: per-crop statistics (the 20 numbers
``tile_stats`` restores into every embedding, per view, pooled as ``field_embedding`` pools
them) and the handcrafted set (``profiles.handcrafted_features``) do not see any of its six
kinds, while they do see the named phenotypes (so the measure could have failed).

Each well is drawn twice from the same seeds, once DMSO and once the kind: the same cells in
the same places under the same nuisance and camera noise (``arrangement.py`` draws nothing of
its own). A feature that the kind moves moves every pair the same way; the test takes the
largest paired shift over the features, in units of the well-to-well spread of DMSO wells
(what a profile's replicate has to stand out from). At or below ``CHANCE`` no recipe can rank
the kind's wells above DMSO's by that feature; the named phenotypes shift theirs by more than
``SEEN``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octstage.cellpainting import families
from octstage.cellpainting.cells import (
    BACKGROUND,
    CHANNEL_ORDER,
    CONTROL,
    Nuisance,
    Phenotype,
    draw_field,
    to_uint16,
)
from octstage.cellpainting.families import LEARNED
from octtrain.data.cellpainting import scale
from octtrain.embed.encode import field_embedding, field_views, tile_stats
from octtrain.eval.cellpainting.profiles import handcrafted_features

SIZE = 128  # the twin's default field
TILE = 32  # the tiny DINO preset's crop (configs/pretrain/dino-tiny.yaml)
WELLS = 24
FIELDS = 2
CHANCE = 0.45  # largest paired shift a learned kind may leave, in DMSO well-to-well sds
SEEN = 1.0  # smallest largest-shift of a named phenotype: the measure sees amounts
FLAT = np.ones((len(CHANNEL_ORDER), SIZE, SIZE), np.float32)  # illumination corrected
FULL = 2500.0 * 1.5 + BACKGROUND  # counts taken to 255, as a plate's upper percentile does


def _uint8(counts: np.ndarray) -> np.ndarray:
    return np.clip(counts.astype(np.float64) / FULL * 255.0, 0, 255).astype(np.uint8)


def _features(field: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A uint8 field's per-crop statistics (mean and spread over its views) and handcrafted set."""
    views = scale(torch.from_numpy(field_views(field, TILE)))
    stats = field_embedding(tile_stats(views)).numpy().astype(np.float64)
    return stats, handcrafted_features(field)


def _wells(phenotype: Phenotype) -> tuple[np.ndarray, np.ndarray]:
    """``[WELLS, features]`` well profiles (the mean over the well's fields) of ``phenotype``,
    statistics and handcrafted, each well under its own nuisance."""
    stats, hand = [], []
    for well in range(WELLS):
        nuisance = Nuisance.of_well(np.random.default_rng([51, well]))
        rows = []
        for site in range(FIELDS):
            cells = int(np.random.default_rng([51, well, site]).integers(*nuisance.cells))
            field = draw_field(np.random.default_rng([51, well, site, 1]), SIZE, phenotype, cells)
            camera = np.random.default_rng([51, well, site, 2])
            rows.append(_features(_uint8(to_uint16(camera, field, FLAT, 1.0, nuisance.stain))))
        stats.append(np.mean([r[0] for r in rows], axis=0))
        hand.append(np.mean([r[1] for r in rows], axis=0))
    return np.asarray(stats), np.asarray(hand)


def _largest_shift(control: np.ndarray, changed: np.ndarray) -> float:
    """The largest paired mean shift over the features, over DMSO's well-to-well sd."""
    spread = control.std(axis=0, ddof=1)
    keep = spread > 1e-9  # a constant feature (a view count that never changes) shows nothing
    shift = np.abs((changed - control).mean(axis=0))[keep] / spread[keep]
    return float(shift.max())


@pytest.fixture(scope="module")
def dmso() -> tuple[np.ndarray, np.ndarray]:
    return _wells(CONTROL)


@pytest.mark.parametrize("kind", sorted(LEARNED))
def test_per_crop_statistics_and_the_handcrafted_set_do_not_see_a_learned_kind(
    kind: str, dmso: tuple[np.ndarray, np.ndarray]
) -> None:
    stats, hand = _wells(LEARNED[kind][1])
    by_stats, by_hand = _largest_shift(dmso[0], stats), _largest_shift(dmso[1], hand)
    assert by_stats < CHANCE, (kind, "per-crop statistics", by_stats)
    assert by_hand < CHANCE, (kind, "handcrafted", by_hand)


# The named phenotypes that change an amount these features measure (JCP2022_037716 is the
# strong control; the ER, AGP and RNA ones are subtle).
NAMED = ["JCP2022_037716", "JCP2022_904321", "JCP2022_801234", "JCP2022_047355"]


@pytest.mark.parametrize("perturbation", NAMED)
def test_the_same_measure_sees_a_named_phenotype(
    perturbation: str, dmso: tuple[np.ndarray, np.ndarray]
) -> None:
    stats, hand = _wells(families.PHENOTYPES[perturbation][1])
    assert _largest_shift(dmso[0], stats) > SEEN, perturbation
    assert _largest_shift(dmso[1], hand) > SEEN, perturbation
