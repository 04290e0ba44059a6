"""cp-measure's CellProfiler measurements as the profiles' handcrafted baseline."""

from __future__ import annotations

import numpy as np
import pytest

from octtrain.eval.cellpainting import cp_features
from tests.octtrain.cell_cache import synth_field

pytest.importorskip("cp_measure")


def test_features_measure_the_nucleus_size_and_have_one_length() -> None:
    rng = np.random.default_rng(1)
    small, large = synth_field(rng, 0, 5, 64), synth_field(rng, 1, 5, 64)
    fs, fl = cp_features.cp_measure_features(small), cp_features.cp_measure_features(large)
    assert fs.shape == fl.shape == (cp_features.feature_count(5),)
    assert np.isfinite(fs).all() and np.isfinite(fl).all()
    # The nuclei's mean area comes first among the size/shape measurements of the nuclei.
    area = cp_features.feature_names(5).index("nuclei/Area")
    assert fl[area] > 2 * fs[area]


def test_a_field_without_nuclei_is_zeros_of_the_same_length() -> None:
    blank = np.zeros((5, 64, 64), np.uint8)
    out = cp_features.cp_measure_features(blank)
    assert out.shape == (cp_features.feature_count(5),) and not out.any()
