"""Classification metrics and collapse indicators: pure numpy, no torch, no I/O.

Conventions (checked against scikit-learn in tests/octtrain/test_metrics.py):

* ``labels`` are class indices in ``[0, num_classes)``, ``probs`` is ``(n, num_classes)``.
* The confusion matrix has true classes in rows and predicted classes in columns.
* A value that is mathematically undefined is ``nan`` here and ``None`` in :func:`to_jsonable`
  output, never a crash and never a silent 0: recall of a class absent from the labels,
  precision of a class never predicted, AUROC of a class that is absent (or is every label),
  AUPR of a class with no positive, kappa when both raters put everything in one class.
* Macro averages skip undefined classes (scikit-learn's ``zero_division=np.nan``) and are
  ``nan`` when no class is defined; the per-class arrays say which classes were skipped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def _check_labels(labels: npt.ArrayLike, num_classes: int) -> IntArray:
    y = np.asarray(labels, dtype=np.int64).reshape(-1)
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got {y.min()}..{y.max()}")
    return y


def _check_probs(probs: npt.ArrayLike, n: int, num_classes: int) -> FloatArray:
    p = np.asarray(probs, dtype=np.float64)
    if p.shape != (n, num_classes):
        raise ValueError(f"probs must have shape ({n}, {num_classes}), got {p.shape}")
    return p


def confusion_matrix(labels: npt.ArrayLike, preds: npt.ArrayLike, num_classes: int) -> IntArray:
    """``cm[t, p]`` counts samples of true class ``t`` predicted as ``p``."""
    y = _check_labels(labels, num_classes)
    yhat = _check_labels(preds, num_classes)
    if y.shape != yhat.shape:
        raise ValueError(f"labels and preds differ in length: {y.size} != {yhat.size}")
    flat = np.bincount(y * num_classes + yhat, minlength=num_classes * num_classes)
    return flat.reshape(num_classes, num_classes).astype(np.int64)


def _safe_div(num: FloatArray, den: FloatArray) -> FloatArray:
    out = np.full(np.shape(num), np.nan, dtype=np.float64)
    np.divide(num, den, out=out, where=den > 0)
    return out


def accuracy(cm: IntArray) -> float:
    """Share of correct predictions; nan for an empty matrix."""
    total = cm.sum()
    return float(np.trace(cm) / total) if total else math.nan


def per_class_precision_recall_f1(cm: IntArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Per-class precision, recall and F1 (``2TP / (2TP + FP + FN)``), nan where undefined."""
    tp = np.diag(cm).astype(np.float64)
    predicted = cm.sum(axis=0).astype(np.float64)
    support = cm.sum(axis=1).astype(np.float64)
    precision = _safe_div(tp, predicted)
    recall = _safe_div(tp, support)
    f1 = _safe_div(2 * tp, predicted + support)
    return precision, recall, f1


def _nanmean(values: FloatArray) -> float:
    finite = values[~np.isnan(values)]
    return float(finite.mean()) if finite.size else math.nan


def balanced_accuracy(cm: IntArray) -> float:
    """Mean recall over the classes present in the labels (absent classes are skipped)."""
    return _nanmean(per_class_precision_recall_f1(cm)[1])


def macro_f1(cm: IntArray) -> float:
    """Mean F1 over classes that are present or predicted."""
    return _nanmean(per_class_precision_recall_f1(cm)[2])


def cohen_kappa(cm: IntArray) -> float:
    """Cohen's kappa between labels and predictions; nan when chance agreement is total."""
    total = cm.sum()
    if not total:
        return math.nan
    observed = np.trace(cm) / total
    expected = float(cm.sum(axis=1) @ cm.sum(axis=0)) / total**2
    if expected >= 1.0:
        return math.nan
    return float((observed - expected) / (1.0 - expected))


def _average_ranks(scores: FloatArray) -> FloatArray:
    """1-based ranks, ties sharing their mean rank (what the Mann-Whitney statistic needs)."""
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    # Boundaries of runs of equal scores.
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], scores.size]
    ranks_sorted = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    ranks = np.empty_like(ranks_sorted)
    ranks[order] = ranks_sorted
    return ranks


def binary_auroc(positive: npt.NDArray[np.bool_], scores: FloatArray) -> float:
    """Area under the ROC curve; nan unless both positives and negatives are present."""
    n_pos = int(positive.sum())
    n_neg = positive.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    rank_sum = float(_average_ranks(scores)[positive].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def binary_average_precision(positive: npt.NDArray[np.bool_], scores: FloatArray) -> float:
    """Average precision (step-wise area under precision-recall, scikit-learn's definition).

    nan when there is no positive: recall is undefined then.
    """
    n_pos = int(positive.sum())
    if n_pos == 0:
        return math.nan
    order = np.argsort(-scores, kind="mergesort")
    s = scores[order]
    hits = positive[order].astype(np.float64)
    # One operating point per distinct threshold: the last index of each run of equal scores.
    last = np.flatnonzero(np.r_[s[1:] != s[:-1], True])
    tp = np.cumsum(hits)[last]
    seen = last + 1.0
    precision = tp / seen
    recall = tp / n_pos
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def one_vs_rest(
    labels: npt.ArrayLike, probs: npt.ArrayLike, num_classes: int
) -> tuple[FloatArray, FloatArray]:
    """Per-class one-vs-rest AUROC and AUPR (nan for classes where they are undefined)."""
    y = _check_labels(labels, num_classes)
    p = _check_probs(probs, y.size, num_classes)
    auroc = np.array([binary_auroc(y == c, p[:, c]) for c in range(num_classes)])
    aupr = np.array([binary_average_precision(y == c, p[:, c]) for c in range(num_classes)])
    return auroc, aupr


def mean_entropy(probs: npt.ArrayLike) -> float:
    """Mean Shannon entropy of the predicted distributions, in nats (0 when always certain)."""
    p = np.asarray(probs, dtype=np.float64)
    if p.size == 0:
        return math.nan
    logs = np.log(np.where(p > 0, p, 1.0))
    return float(-(p * logs).sum(axis=1).mean())


def histogram(preds: npt.ArrayLike, num_classes: int) -> IntArray:
    """How many samples were predicted as each class."""
    return np.bincount(_check_labels(preds, num_classes), minlength=num_classes).astype(np.int64)


@dataclass(frozen=True)
class Collapse:
    """One class takes more than the allowed share of predictions."""

    class_index: int
    share: float
    max_share: float

    def message(self, class_names: Sequence[str]) -> str:
        name = class_names[self.class_index] if self.class_index < len(class_names) else "?"
        return (
            f"prediction collapse: class {self.class_index} ({name}) takes "
            f"{self.share:.0%} of predictions (alarm above {self.max_share:.0%})"
        )


def check_collapse(hist: npt.ArrayLike, max_share: float) -> Collapse | None:
    """A :class:`Collapse` when the most predicted class exceeds ``max_share``, else None."""
    h = np.asarray(hist, dtype=np.float64)
    total = h.sum()
    if total <= 0:
        return None
    top = int(h.argmax())
    share = float(h[top] / total)
    return Collapse(top, share, max_share) if share > max_share else None


def participant_level(
    participants: Sequence[str], labels: npt.ArrayLike, probs: npt.ArrayLike
) -> tuple[list[str], IntArray, FloatArray]:
    """Average the probabilities of each participant's volumes (participants sorted by id).

    A participant whose volumes carry different labels is a data error, not something to average.
    """
    y = np.asarray(labels, dtype=np.int64).reshape(-1)
    p = np.asarray(probs, dtype=np.float64)
    if len(participants) != y.size or p.shape[0] != y.size:
        raise ValueError(
            f"participants ({len(participants)}), labels ({y.size}) and probs ({p.shape[0]}) "
            "differ in length"
        )
    ids = sorted(set(participants))
    row = {pid: i for i, pid in enumerate(ids)}
    index = np.array([row[pid] for pid in participants], dtype=np.int64)
    sums = np.zeros((len(ids), p.shape[1] if p.ndim == 2 else 0), dtype=np.float64)
    np.add.at(sums, index, p)
    counts = np.bincount(index, minlength=len(ids)).astype(np.float64)
    plabels = np.full(len(ids), -1, dtype=np.int64)
    for i, lab in zip(index, y, strict=True):
        if plabels[i] not in (-1, lab):
            raise ValueError(f"participant {ids[i]} has volumes labelled {plabels[i]} and {lab}")
        plabels[i] = lab
    return ids, plabels, sums / np.maximum(counts, 1.0)[:, None]


@dataclass(frozen=True)
class ClassificationMetrics:
    """Everything reported for one set of predictions."""

    num_samples: int
    accuracy: float
    balanced_accuracy: float
    macro_f1: float
    kappa: float
    macro_auroc: float
    macro_aupr: float
    mean_entropy: float
    precision: FloatArray
    recall: FloatArray
    f1: FloatArray
    auroc: FloatArray
    aupr: FloatArray
    support: IntArray
    histogram: IntArray
    confusion: IntArray

    def scalar(self, name: str) -> float:
        """A headline metric by name (for early stopping and model selection)."""
        if name not in SCALAR_METRICS:
            raise ValueError(f"unknown metric {name!r}; choose one of {', '.join(SCALAR_METRICS)}")
        return float(getattr(self, name))


SCALAR_METRICS: tuple[str, ...] = (
    "accuracy",
    "balanced_accuracy",
    "macro_f1",
    "kappa",
    "macro_auroc",
    "macro_aupr",
)


def classification_metrics(
    labels: npt.ArrayLike, probs: npt.ArrayLike, num_classes: int
) -> ClassificationMetrics:
    """All metrics from true labels and predicted probabilities (prediction = argmax)."""
    y = _check_labels(labels, num_classes)
    p = _check_probs(probs, y.size, num_classes)
    preds = p.argmax(axis=1) if y.size else np.zeros(0, dtype=np.int64)
    cm = confusion_matrix(y, preds, num_classes)
    precision, recall, f1 = per_class_precision_recall_f1(cm)
    auroc, aupr = one_vs_rest(y, p, num_classes)
    return ClassificationMetrics(
        num_samples=int(y.size),
        accuracy=accuracy(cm),
        balanced_accuracy=_nanmean(recall),
        macro_f1=_nanmean(f1),
        kappa=cohen_kappa(cm),
        macro_auroc=_nanmean(auroc),
        macro_aupr=_nanmean(aupr),
        mean_entropy=mean_entropy(p),
        precision=precision,
        recall=recall,
        f1=f1,
        auroc=auroc,
        aupr=aupr,
        support=cm.sum(axis=1),
        histogram=cm.sum(axis=0),
        confusion=cm,
    )


def _jsonable(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def to_jsonable(m: ClassificationMetrics, class_names: Sequence[str]) -> dict[str, Any]:
    """A JSON-ready dict; undefined values become ``None`` (JSON ``null``), never NaN."""
    per_class = {
        name: {
            "precision": _jsonable(m.precision[i]),
            "recall": _jsonable(m.recall[i]),
            "f1": _jsonable(m.f1[i]),
            "auroc": _jsonable(m.auroc[i]),
            "aupr": _jsonable(m.aupr[i]),
            "support": int(m.support[i]),
            "predicted": int(m.histogram[i]),
        }
        for i, name in enumerate(class_names)
    }
    return {
        "num_samples": m.num_samples,
        **{name: _jsonable(m.scalar(name)) for name in SCALAR_METRICS},
        "mean_entropy": _jsonable(m.mean_entropy),
        "per_class": per_class,
        "confusion_matrix": m.confusion.tolist(),
        "classes": list(class_names),
    }


def flat_scalars(m: ClassificationMetrics, class_names: Sequence[str]) -> dict[str, float]:
    """Flat ``name -> value`` for a tracker (nan kept: W&B shows it as a gap, not a zero)."""
    out = {name: m.scalar(name) for name in SCALAR_METRICS}
    out["mean_entropy"] = m.mean_entropy
    for i, name in enumerate(class_names):
        out[f"precision/{name}"] = float(m.precision[i])
        out[f"recall/{name}"] = float(m.recall[i])
        out[f"f1/{name}"] = float(m.f1[i])
        out[f"auroc/{name}"] = float(m.auroc[i])
        out[f"predicted_share/{name}"] = (
            float(m.histogram[i] / m.num_samples) if m.num_samples else math.nan
        )
    return out
