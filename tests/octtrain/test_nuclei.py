"""The one nucleus segmentation the single-cell views and cp-measure's features share."""

from __future__ import annotations

import numpy as np

from octtrain.data.nuclei import nucleus_centres, segment


def test_segmentation_finds_each_nucleus_and_grows_cells_around_it() -> None:
    field = np.zeros((5, 64, 64), np.uint8)
    field[0, 10:18, 10:18] = 200
    field[0, 40:50, 40:50] = 200
    nuclei, cells = segment(field, cell_expand=4)
    assert nuclei.max() == 2 and cells.max() == 2
    assert (cells > 0).sum() > (nuclei > 0).sum()
    assert np.array_equal(cells[nuclei > 0], nuclei[nuclei > 0])  # cells contain their nucleus


def test_a_flat_field_has_no_nuclei() -> None:
    nuclei, cells = segment(np.full((5, 32, 32), 7, np.uint8))
    assert not nuclei.any() and not cells.any()


def test_nucleus_centres_are_their_centres_of_mass_in_label_order() -> None:
    labels = np.zeros((20, 30), np.int32)
    labels[2:5, 3:6] = 1  # centre (3, 4)
    labels[10:12, 20:28] = 2  # centre (10.5, 23.5)
    np.testing.assert_allclose(nucleus_centres(labels), [[3.0, 4.0], [10.5, 23.5]])
    assert nucleus_centres(np.zeros((4, 4), np.int32)).shape == (0, 2)
