"""A k-nearest-neighbour probe of frozen features (pure numpy): how well pooled features
separate the labels, with no training. Pretraining selects its best checkpoint by it, because a
collapsed encoder, which can reach a low prediction loss, cannot separate anything."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from octtrain.eval.common.metrics import balanced_accuracy, confusion_matrix


def knn_balanced_accuracy(
    features: npt.NDArray[np.floating], labels: npt.NDArray[np.integer], k: int | None = None
) -> float:
    """Leave-one-out k-NN balanced accuracy over the classes present; nan with fewer than two
    classes or two samples.

    Cosine similarity of the *centred* features (pooled transformer features share a large
    common direction that would otherwise dominate every similarity), majority vote, ties to the
    nearest. ``k`` None: half the smallest class, at most 10, so a small validation split is not
    outvoted by the other classes."""
    y = np.asarray(labels, dtype=np.int64)
    known = y >= 0  # unlabelled volumes (label -1) neither vote nor count
    y, x = y[known], np.asarray(features, dtype=np.float64)[known]
    present = np.unique(y)
    if len(present) < 2 or len(y) < 2:
        return math.nan
    x = x - x.mean(axis=0, keepdims=True)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    sim = x @ x.T
    np.fill_diagonal(sim, -np.inf)  # leave each sample out of its own vote
    if k is None:
        k = min(10, max(1, int(np.bincount(y)[present].min()) // 2))
    k = min(k, len(y) - 1)
    nearest = np.argsort(-sim, axis=1, kind="stable")[:, :k]
    num_classes = int(y.max()) + 1
    preds = np.empty_like(y)
    for i, row in enumerate(nearest):
        votes = np.bincount(y[row], minlength=num_classes)
        tied = np.flatnonzero(votes == votes.max())
        preds[i] = next(int(y[j]) for j in row if y[j] in tied)  # the nearest tied class
    cm = confusion_matrix(y, preds, num_classes)[np.ix_(present, present)]
    return balanced_accuracy(cm)
