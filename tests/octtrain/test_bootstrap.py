"""Participant-bootstrap intervals and per-group scoring (pure: no files, no torch)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import numpy.typing as npt
import pytest

from octstage import manifest as mf
from octtrain.errors import ConfigError
from octtrain.eval.common.bootstrap import Interval, bootstrap
from octtrain.eval.oct.breakdown import (
    INTERVAL_METRICS,
    BootstrapSpec,
    breakdown,
    scalar_metrics,
    site_of,
    to_jsonable,
)

BACC = INTERVAL_METRICS.index("balanced_accuracy")


def predictions(
    participants: int, seed: int = 0
) -> tuple[list[str], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Two volumes (eyes) per participant, 4 classes, a noisy but informative classifier;
    both eyes of a participant share the participant's label and most of its error."""
    rng = np.random.default_rng(seed)
    pids, labels, probs = [], [], []
    for k in range(participants):
        label = k % 4
        shared = rng.normal(0, 1.2, size=4)  # a participant's error, common to both eyes
        for _ in range(2):
            logits = shared + rng.normal(0, 0.3, size=4)
            logits[label] += 1.0
            pids.append(f"{1000 + k}")
            labels.append(label)
            probs.append(np.exp(logits) / np.exp(logits).sum())
    return pids, np.array(labels), np.array(probs)


def bacc_interval(
    pids: list[str],
    y: npt.NDArray[np.int64],
    p: npt.NDArray[np.float64],
    by_participant: bool,
    seed: int = 0,
) -> tuple[float, float, float]:
    def metric(idx: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        return scalar_metrics(y[idx], p[idx], 4)

    i = bootstrap(metric, pids if by_participant else None, len(y), 400, seed)[BACC]
    return i.value, i.low, i.high


def duplicated(
    pids: list[str], y: npt.NDArray[np.int64], p: npt.NDArray[np.float64], copies: int
) -> tuple[list[str], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Every participant's volumes ``copies`` times (the same participants, more volumes)."""
    order = np.argsort(np.array(pids), kind="stable")
    idx = np.repeat(order, copies)
    return [pids[i] for i in idx], y[idx], p[idx]


def test_duplicating_volumes_does_not_narrow_the_participant_interval() -> None:
    pids, y, p = predictions(40)
    value, low, high = bacc_interval(pids, y, p, by_participant=True)
    d_value, d_low, d_high = bacc_interval(*duplicated(pids, y, p, 5), by_participant=True)
    # Same participants and the same draws of them: the very same interval.
    assert d_value == pytest.approx(value)
    assert (d_low, d_high) == pytest.approx((low, high))
    assert high - low > 0.05


def test_a_per_volume_bootstrap_is_narrowed_by_duplicates() -> None:
    """What the participant bootstrap guards against: resampling volumes treats copies as
    evidence, and five copies of each volume shrink the interval by about sqrt(5)."""
    pids, y, p = predictions(40)
    _, low, high = bacc_interval(pids, y, p, by_participant=False)
    _, d_low, d_high = bacc_interval(*duplicated(pids, y, p, 5), by_participant=False)
    assert d_high - d_low < 0.7 * (high - low)


def test_duplicating_one_participant_does_not_narrow_the_interval() -> None:
    pids, y, p = predictions(40)
    _, low, high = bacc_interval(pids, y, p, by_participant=True)
    first = [i for i, pid in enumerate(pids) if pid == pids[0]]
    idx = np.r_[np.arange(len(pids)), np.repeat(first, 20)]
    _, d_low, d_high = bacc_interval([pids[i] for i in idx], y[idx], p[idx], True)
    assert d_high - d_low >= 0.9 * (high - low)


def test_same_seed_same_interval_other_seed_other_draws() -> None:
    pids, y, p = predictions(30)
    assert bacc_interval(pids, y, p, True, seed=3) == bacc_interval(pids, y, p, True, seed=3)
    assert bacc_interval(pids, y, p, True, seed=3) != bacc_interval(pids, y, p, True, seed=4)


def test_undefined_resamples_are_skipped_and_counted() -> None:
    # 6 participants: some resamples miss a class, where that class's AUROC is undefined but
    # the macro AUROC over the classes present still is; a one-class draw has none.
    y = np.array([0, 1, 0, 1, 0, 1])
    p = np.array([[0.8, 0.2], [0.3, 0.7], [0.6, 0.4], [0.4, 0.6], [0.7, 0.3], [0.2, 0.8]])

    def metric(idx: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        return scalar_metrics(y[idx], p[idx], 2)

    auroc = bootstrap(metric, None, 6, 500, 0)[INTERVAL_METRICS.index("macro_auroc")]
    assert auroc.value == 1.0 and 0 < auroc.valid < 500
    assert not math.isnan(auroc.low)


def volume(pid: str, device: str, label: int) -> mf.Volume:
    return mf.Volume(
        participant_id=pid,
        device=device,
        laterality="L",
        protocol="p",
        split="test",
        study_group=f"g{label}",
        label=label,
        source_path=f"{pid}.dcm",
        source_sha1="0" * 40,
        source_size=0,
        transfer_syntax="1.2.840.10008.1.2.1",
        source_shape=(1, 1, 1),
        spacing_mm=(1.0, 1.0, 1.0),
        zarr_path=f"v/{pid}/{device}",
        shape=(1, 1, 1),
        dtype="uint8",
        normalization=mf.Normalization(1.0, 99.0, 0.0, 255.0),
        checksum="sha256:0",
        cache_key="k",
    )


def test_breakdown_groups_counts_and_too_small() -> None:
    # 12 UW participants on two devices, 3 UAB participants on one: UAB is too small.
    vols, labels = [], []
    for k in range(12):
        for device in ("topcon_maestro2", "zeiss_cirrus"):
            vols.append(volume(f"1{k:03d}", device, k % 2))
            labels.append(k % 2)
    for k in range(3):
        vols.append(volume(f"7{k:03d}", "zeiss_cirrus", k % 2))
        labels.append(k % 2)
    y = np.array(labels)
    p = np.where(np.eye(2)[y] > 0, 0.7, 0.3)
    spec = BootstrapSpec(resamples=50, seed=1, min_participants=5)
    rows = {(r.grouping, r.name): r for r in breakdown(vols, y, p, 2, spec)}
    assert sorted(rows) == [
        ("device", "topcon_maestro2"),
        ("device", "zeiss_cirrus"),
        ("overall", "all volumes"),
        ("participant", "all participants"),
        ("site", "UAB"),
        ("site", "UW"),
    ]  # no region: this manifest does not record one
    whole = rows["overall", "all volumes"]
    assert (whole.volumes, whole.participants) == (27, 15)
    cirrus = rows["device", "zeiss_cirrus"]
    assert (cirrus.volumes, cirrus.participants) == (15, 15)
    uab = rows["site", "UAB"]
    assert uab.too_small is not None and "3 participant(s)" in uab.too_small and not uab.metrics
    assert rows["site", "UW"].metrics["balanced_accuracy"].value == 1.0
    doc = to_jsonable(list(rows.values()), spec)
    assert doc["bootstrap"]["seed"] == 1 and doc["bootstrap"]["resamples"] == 50
    uab_doc = next(g for g in doc["groups"] if g["group"] == "UAB")
    assert "metrics" not in uab_doc and uab_doc["participants"] == 3

    regions = [dataclasses.replace(v, anatomic_region="Macula") for v in vols]
    regions[-1] = dataclasses.replace(regions[-1], anatomic_region="")
    names = {(r.grouping, r.name) for r in breakdown(regions, y, p, 2, spec)}
    assert {("region", "Macula"), ("region", "unrecorded")} <= names


def test_site_from_the_first_digit_and_spec_checks() -> None:
    assert [site_of(x) for x in ("1001", "4150", "7111", "2000")] == [
        "UW",
        "UCSD",
        "UAB",
        "unknown",
    ]
    with pytest.raises(ConfigError, match="--bootstrap"):
        BootstrapSpec(resamples=0)


def test_evaluates_breakdown_resamples_participants_not_volumes() -> None:
    """The report's groups (what evaluate and probe write): five copies of every participant's
    volumes give the very same intervals, as whole participants are drawn."""
    pids, y, p4 = predictions(40)
    p = p4[:, :2] / p4[:, :2].sum(axis=1, keepdims=True)  # two classes, as ``volume`` labels
    y = y % 2
    spec = BootstrapSpec(resamples=200, seed=2, min_participants=5)

    def overall(
        ids: list[str], labels: npt.NDArray[np.int64], probs: npt.NDArray[np.float64]
    ) -> Interval:
        pairs = zip(ids, labels, strict=True)
        vols = [volume(pid, "zeiss_cirrus", int(label)) for pid, label in pairs]
        rows = {(r.grouping, r.name): r for r in breakdown(vols, labels, probs, 2, spec)}
        return rows["overall", "all volumes"].metrics["balanced_accuracy"]

    once = overall(pids, y, p)
    copies = overall(*duplicated(pids, y, p, 5))
    assert once.high - once.low > 0.05
    assert (copies.low, copies.high) == pytest.approx((once.low, once.high))
