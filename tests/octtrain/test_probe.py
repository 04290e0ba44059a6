"""The k-NN probe that selects pretraining checkpoints: separable features score high,
collapsed or random ones score at chance, unlabelled samples are ignored."""

from __future__ import annotations

import math

import numpy as np

from octtrain.eval.common.knn import knn_balanced_accuracy


def test_separable_features_score_one_collapsed_ones_score_chance() -> None:
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 10)
    centres = rng.normal(size=(4, 16)) * 5
    separable = centres[labels] + rng.normal(size=(40, 16))
    assert knn_balanced_accuracy(separable, labels) == 1.0
    collapsed = np.ones((40, 16)) + 1e-9 * rng.normal(size=(40, 16))
    assert knn_balanced_accuracy(collapsed, labels) < 0.5
    random = rng.normal(size=(40, 16))
    assert knn_balanced_accuracy(random, labels) < 0.6


def test_unlabelled_samples_are_left_out_and_one_class_is_undefined() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 4))
    assert math.isnan(knn_balanced_accuracy(x, np.array([2, 2, 2, -1, -1, 2])))
    labels = np.array([0, 0, 1, 1, -1, -1])
    x[:2] += 10
    x[2:4] -= 10
    x[4:] += 10  # unlabelled, near class 0: would vote for it if counted
    assert knn_balanced_accuracy(x, labels, k=1) == 1.0
