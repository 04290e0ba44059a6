"""The lesion generator: its labels are the number of blobs its docstring promises, per seed."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from octstage.dataset.synth_lesions import (
    BRIGHT,
    DARK,
    NUM_CLASSES,
    render_lesions,
    render_lesions_with_mask,
)

SHAPE = (16, 32, 32)


def gain_of(volume: np.ndarray) -> float:
    """The volume's gain, read off the inner band (level 120, the thickest band, so the most
    common value; uint8 truncates, hence the half)."""
    return (float(np.bincount(volume.ravel()).argmax()) + 0.5) / 120.0


def at_level(volume: np.ndarray, level: float) -> np.ndarray:
    """Where the volume is at ``level`` times its gain (clipped at 255), give or take 2."""
    return np.abs(volume.astype(np.float32) - min(level * gain_of(volume), 255.0)) <= 2


def blobs(volume: np.ndarray) -> list[int]:
    """Sizes of the connected blobs at the bright (245) or dark (15) lesion level times the gain:
    (bright ones clipped at 255) with no speckle, no band has either level (10, 190, 120, 50,
    220, 90)."""
    sizes = []
    for level in (BRIGHT, DARK):
        labelled, n = ndimage.label(at_level(volume, level))
        sizes += [int((labelled == i).sum()) for i in range(1, n + 1)]
    return sizes


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("label", range(NUM_CLASSES))
def test_the_label_is_the_number_of_79_voxel_blobs(label: int, seed: int) -> None:
    volume = render_lesions(SHAPE, label, np.random.default_rng(seed), speckle=False)
    assert blobs(volume) == [79] * label


def test_volumes_are_deterministic_per_seed() -> None:
    def draw(seed: int) -> np.ndarray:
        return render_lesions(SHAPE, 2, np.random.default_rng(seed))

    assert draw(3).dtype == np.uint8 and draw(3).shape == SHAPE
    np.testing.assert_array_equal(draw(3), draw(3))
    assert not np.array_equal(draw(3), draw(4))


def test_bright_and_dark_lesions_both_occur() -> None:
    volumes = [render_lesions(SHAPE, 3, np.random.default_rng(s), speckle=False) for s in range(6)]
    for level in (BRIGHT, DARK):
        assert any(at_level(v, level).any() for v in volumes)


def test_labels_outside_the_classes_are_refused() -> None:
    with pytest.raises(ValueError, match="label"):
        render_lesions(SHAPE, NUM_CLASSES, np.random.default_rng(0))


@pytest.mark.parametrize("label", range(NUM_CLASSES))
def test_the_mask_is_where_the_lesions_are(label: int) -> None:
    volume, mask = render_lesions_with_mask(SHAPE, label, np.random.default_rng(label), False)
    lesion = at_level(volume, BRIGHT) | at_level(volume, DARK)
    assert mask.sum() == 79 * label
    assert (mask == lesion).all()
    again = render_lesions(SHAPE, label, np.random.default_rng(label), speckle=False)
    assert (again == volume).all()  # the same draws as the volume alone
