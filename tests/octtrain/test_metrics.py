"""octtrain.metrics against scikit-learn on random data, plus the undefined and collapse cases."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn import metrics as skm

from octtrain.eval.common import metrics as m

C = 4
NAMES = ("a", "b", "c", "d")


@st.composite
def predictions(draw: st.DrawFn) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Random labels (some classes possibly absent) and probabilities with deliberate ties."""
    n = draw(st.integers(min_value=1, max_value=60))
    seed = draw(st.integers(min_value=0, max_value=2**31 - 1))
    present = draw(st.lists(st.integers(0, C - 1), min_size=1, max_size=C, unique=True))
    rng = np.random.default_rng(seed)
    labels = rng.choice(np.array(present), size=n)
    logits = rng.normal(size=(n, C))
    if draw(st.booleans()):
        logits = np.round(logits, 1)  # ties in scores: rank and threshold handling matter
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return labels.astype(np.int64), probs


def _same(ours: float, theirs: float) -> bool:
    return (math.isnan(ours) and math.isnan(theirs)) or math.isclose(ours, theirs, abs_tol=1e-9)


@settings(max_examples=60, deadline=None)
@given(predictions())
def test_metrics_match_sklearn(data: tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]) -> None:
    y, p = data
    yhat = p.argmax(axis=1)
    ours = m.classification_metrics(y, p, C)
    labels = list(range(C))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        np.testing.assert_array_equal(ours.confusion, skm.confusion_matrix(y, yhat, labels=labels))
        assert _same(ours.accuracy, skm.accuracy_score(y, yhat))
        assert _same(ours.balanced_accuracy, skm.balanced_accuracy_score(y, yhat))
        prec, rec, f1, support = skm.precision_recall_fscore_support(
            y, yhat, labels=labels, zero_division=np.nan
        )
        np.testing.assert_allclose(ours.precision, prec, equal_nan=True)
        np.testing.assert_allclose(ours.recall, rec, equal_nan=True)
        np.testing.assert_allclose(ours.f1, f1, equal_nan=True)
        np.testing.assert_array_equal(ours.support, support)
        macro = skm.f1_score(y, yhat, labels=labels, average="macro", zero_division=np.nan)
        assert _same(ours.macro_f1, macro)
        assert _same(ours.kappa, skm.cohen_kappa_score(y, yhat, labels=labels))
    for c in range(C):
        positive = y == c
        if positive.any() and not positive.all():
            assert math.isclose(ours.auroc[c], skm.roc_auc_score(positive, p[:, c]), abs_tol=1e-9)
        else:
            assert math.isnan(ours.auroc[c])
        if positive.any():
            expected = skm.average_precision_score(positive, p[:, c])
            assert math.isclose(ours.aupr[c], expected, abs_tol=1e-9)
        else:
            assert math.isnan(ours.aupr[c])
    entropy = float(np.mean(-(p * np.log(p)).sum(axis=1)))
    assert math.isclose(ours.mean_entropy, entropy, rel_tol=1e-9)
    np.testing.assert_array_equal(ours.histogram, np.bincount(yhat, minlength=C))


def test_macro_auroc_matches_sklearn_when_all_classes_present() -> None:
    rng = np.random.default_rng(3)
    y = np.tile(np.arange(C), 25)
    logits = rng.normal(size=(y.size, C)) + 1.5 * np.eye(C)[y]
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    ours = m.classification_metrics(y, p, C)
    assert math.isclose(ours.macro_auroc, skm.roc_auc_score(y, p, multi_class="ovr"), rel_tol=1e-9)
    onehot = np.eye(C)[y]
    assert math.isclose(
        ours.macro_aupr, skm.average_precision_score(onehot, p, average="macro"), rel_tol=1e-9
    )


def test_single_class_labels_are_undefined_not_a_crash() -> None:
    y = np.zeros(10, dtype=np.int64)
    p = np.full((10, C), 0.25)
    p[:, 2] += 0.1
    out = m.classification_metrics(y, p / p.sum(axis=1, keepdims=True), C)
    assert math.isnan(out.macro_auroc)  # one class only: no negatives for it, no positives else
    assert np.isnan(out.auroc).all()
    assert out.aupr[0] == pytest.approx(1.0) and np.isnan(out.aupr[1:]).all()
    assert out.balanced_accuracy == 0.0 and out.accuracy == 0.0
    doc = m.to_jsonable(out, NAMES)
    text = json.dumps(doc, allow_nan=False)  # NaN would make this raise
    assert doc["macro_auroc"] is None
    assert doc["per_class"]["b"]["recall"] is None
    assert "NaN" not in text


def test_empty_predictions() -> None:
    out = m.classification_metrics(np.zeros(0, dtype=np.int64), np.zeros((0, C)), C)
    assert out.num_samples == 0
    assert math.isnan(out.accuracy) and math.isnan(out.balanced_accuracy)
    assert math.isnan(out.kappa) and math.isnan(out.mean_entropy)
    json.dumps(m.to_jsonable(out, NAMES), allow_nan=False)


def test_perfect_agreement_on_one_class_has_undefined_kappa() -> None:
    cm = m.confusion_matrix([1, 1, 1], [1, 1, 1], C)
    assert math.isnan(m.cohen_kappa(cm))
    assert m.accuracy(cm) == 1.0


def test_bad_inputs_raise_value_error() -> None:
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 4\)"):
        m.confusion_matrix([0, 4], [0, 1], C)
    with pytest.raises(ValueError, match="shape"):
        m.classification_metrics([0, 1], np.zeros((2, 3)), C)
    with pytest.raises(ValueError, match="unknown metric"):
        m.classification_metrics([0], np.eye(C)[[0]], C).scalar("f2")


def test_collapse_alarm() -> None:
    assert m.check_collapse([0, 0, 0, 0], 0.5) is None
    assert m.check_collapse([3, 3, 2, 2], 0.5) is None
    alarm = m.check_collapse([1, 9, 0, 0], 0.8)
    assert alarm is not None and alarm.class_index == 1 and alarm.share == pytest.approx(0.9)
    assert "class 1 (b) takes 90%" in alarm.message(NAMES)
    # Exactly at the threshold is not a collapse (the alarm is "more than").
    assert m.check_collapse([8, 2, 0, 0], 0.8) is None


def test_participant_level_averages_volumes() -> None:
    pids = ["1002", "1001", "1002", "4001"]
    labels = [2, 0, 2, 3]
    probs = np.array([[0, 0, 1, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 1]], dtype=float)
    ids, plabels, pprobs = m.participant_level(pids, labels, probs)
    assert ids == ["1001", "1002", "4001"]
    np.testing.assert_array_equal(plabels, [0, 2, 3])
    np.testing.assert_allclose(pprobs[1], [0, 0.5, 0.5, 0])
    with pytest.raises(ValueError, match="participant 1002 has volumes labelled 2 and 1"):
        m.participant_level(pids, [2, 0, 1, 3], probs)


def test_flat_scalars_for_tracker() -> None:
    y = np.array([0, 1, 2, 3, 0])
    out = m.classification_metrics(y, np.eye(C)[y], C)
    flat = m.flat_scalars(out, NAMES)
    assert flat["balanced_accuracy"] == 1.0
    assert flat["predicted_share/a"] == pytest.approx(0.4)
    assert out.mean_entropy == 0.0
