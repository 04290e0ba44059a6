"""The token-level lesion probe's labels: the twin's lesion masks move with a device's depth
shift, and a token is positive where its patch holds enough lesion voxels."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from octstage.dataset.synth_lesions import render_lesions_with_mask

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_lesion_tokens import token_targets
from device_looks import Look, render_with_mask


@pytest.mark.parametrize("row_shift", [-4, 0, 5])
def test_the_lesion_mask_moves_with_the_retina(row_shift: int) -> None:
    look = Look(row_shift, gain=1.0, gamma=1.0, speckle=1e9, noise=0.0)  # no noise to speak of
    volume, mask = render_with_mask((16, 32, 32), 3, look, np.random.default_rng(1))
    assert mask.sum() == 3 * 79
    # the lesion levels (15 and 245) times the twin's gain (0.85-1.15), not a band's (50-220)
    assert ((volume[mask] <= 18) | (volume[mask] >= 208)).all()
    _, unshifted = render_lesions_with_mask((16, 32, 32), 3, np.random.default_rng(1), False)
    assert (mask == np.roll(unshifted, row_shift, axis=1)).all()


def test_a_token_is_positive_where_its_patch_holds_enough_lesion_voxels() -> None:
    masks = np.zeros((1, 8, 8, 8), dtype=bool)
    masks[0, 0, 0, :3] = True  # 3 voxels in token (0, 0, 0)
    masks[0, 4:6, 4:6, 4:6] = True  # 8 voxels in token (1, 1, 1)
    targets = token_targets(masks, (4, 4, 4), min_voxels=4)
    assert targets.shape == (1, 8)
    assert targets[0].tolist() == [0, 0, 0, 0, 0, 0, 0, 1]
    assert token_targets(masks, (4, 4, 4), min_voxels=3)[0].tolist() == [1, 0, 0, 0, 0, 0, 0, 1]
