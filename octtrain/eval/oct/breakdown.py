"""Metrics overall and per group (device, site, region), each with a participant bootstrap
interval and the counts behind it: pure, no torch, no I/O.

Groups come from what the manifest records per volume: ``device``; ``site``, from the manifest's
``clinical_site`` when it has one, else from the participant id's first digit (1 UW, 4 UCSD,
7 UAB: docs/ai-readi.md); ``region`` (``anatomic_region``) when the manifest has it. A grouping
with one value only (every volume from one site) is still reported: the reader sees it is one.

A group with fewer than ``min_participants`` participants is reported as too small, with its
counts and no numbers: an interval from three participants is noise with error bars.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from octstage.manifest import Volume
from octtrain.errors import ConfigError
from octtrain.eval.common import metrics as mt
from octtrain.eval.common.bootstrap import Interval, bootstrap, stream_of

SITES = {"1": "UW", "4": "UCSD", "7": "UAB"}  # first digit of the participant id
# The headline metrics with intervals, in table order.
INTERVAL_METRICS: tuple[str, ...] = (
    "balanced_accuracy",
    "macro_auroc",
    "accuracy",
    "macro_f1",
    "kappa",
)


def site_of(participant_id: str) -> str:
    """The clinical site from the id's first digit; ``unknown`` for any other digit."""
    return SITES.get(participant_id[:1], "unknown")


def _field(v: Volume, name: str) -> str | None:
    # Fields a newer manifest may carry (issue 17); absent on older ones.
    value = getattr(v, name, None)
    return None if value in (None, "") else str(value)


GROUPINGS: dict[str, Callable[[Volume], str | None]] = {
    "device": lambda v: v.device,
    "site": lambda v: _field(v, "clinical_site") or site_of(v.participant_id),
    "region": lambda v: _field(v, "anatomic_region"),
}


@dataclass(frozen=True)
class BootstrapSpec:
    """How intervals are drawn (recorded in every report)."""

    resamples: int = 1000
    seed: int = 0
    confidence: float = 0.95
    min_participants: int = 5

    def __post_init__(self) -> None:
        if self.resamples < 1:
            raise ConfigError(f"--bootstrap: resamples must be >= 1, got {self.resamples}")
        if not 0.0 < self.confidence < 1.0:
            raise ConfigError(f"confidence must be in (0, 1), got {self.confidence}")
        if self.min_participants < 1:
            raise ConfigError(f"--min-participants must be >= 1, got {self.min_participants}")


@dataclass(frozen=True)
class GroupResult:
    """One row of the report: a group, its counts, and its metrics or why there are none."""

    grouping: str  # overall, participant, device, site, region
    name: str
    volumes: int
    participants: int
    metrics: dict[str, Interval] = field(default_factory=dict)
    too_small: str | None = None  # the reason there are no numbers


def scalar_metrics(
    labels: npt.NDArray[np.int64], probs: npt.NDArray[np.float64], num_classes: int
) -> npt.NDArray[np.float64]:
    """``INTERVAL_METRICS`` of one set of predictions (nan where undefined), fast enough to
    run a thousand times per group."""
    if labels.size == 0:
        return np.full(len(INTERVAL_METRICS), np.nan)
    cm = mt.confusion_matrix(labels, probs.argmax(axis=1), num_classes)
    auroc = [mt.binary_auroc(labels == c, probs[:, c]) for c in range(num_classes)]
    finite = [a for a in auroc if not math.isnan(a)]
    return np.array(
        [
            mt.balanced_accuracy(cm),
            float(np.mean(finite)) if finite else math.nan,
            mt.accuracy(cm),
            mt.macro_f1(cm),
            mt.cohen_kappa(cm),
        ]
    )


def score_group(
    grouping: str,
    name: str,
    participants: Sequence[str],
    labels: npt.NDArray[np.int64],
    probs: npt.NDArray[np.float64],
    num_classes: int,
    spec: BootstrapSpec,
    by_participant: bool = True,
) -> GroupResult:
    """Metrics of one group with intervals; ``by_participant`` False when each item already is
    one participant (participant-level predictions)."""
    n_part = len(set(participants))
    if n_part < spec.min_participants:
        reason = f"too small: {n_part} participant(s), fewer than {spec.min_participants}"
        return GroupResult(grouping, name, len(labels), n_part, too_small=reason)

    def metric(idx: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        return scalar_metrics(labels[idx], probs[idx], num_classes)

    intervals = bootstrap(
        metric,
        list(participants) if by_participant else None,
        len(labels),
        spec.resamples,
        spec.seed,
        stream=stream_of(f"{grouping}/{name}"),
        confidence=spec.confidence,
    )
    return GroupResult(
        grouping, name, len(labels), n_part, dict(zip(INTERVAL_METRICS, intervals, strict=True))
    )


def breakdown(
    volumes: Sequence[Volume],
    labels: npt.ArrayLike,
    probs: npt.ArrayLike,
    num_classes: int,
    spec: BootstrapSpec,
) -> list[GroupResult]:
    """Overall (volume level, then participant level), then every group of every grouping the
    manifest records, groups sorted by name."""
    y = np.asarray(labels, dtype=np.int64).reshape(-1)
    p = np.asarray(probs, dtype=np.float64)
    if len(volumes) != y.size or p.shape != (y.size, num_classes):
        raise ValueError(
            f"{len(volumes)} volumes, {y.size} labels and probs of shape {p.shape} do not match"
        )
    pids = [v.participant_id for v in volumes]
    rows = [score_group("overall", "all volumes", pids, y, p, num_classes, spec)]
    ids, plabels, pprobs = mt.participant_level(pids, y, p)
    rows.append(
        score_group(
            "participant", "all participants", ids, plabels, pprobs, num_classes, spec, False
        )
    )
    for grouping, key in GROUPINGS.items():
        values = [key(v) for v in volumes]
        if all(value is None for value in values):
            continue  # the manifest does not record it
        for name in sorted({value or "unrecorded" for value in values}):
            idx = np.array([i for i, x in enumerate(values) if (x or "unrecorded") == name])
            rows.append(
                score_group(
                    grouping, name, [pids[i] for i in idx], y[idx], p[idx], num_classes, spec
                )
            )
    return rows


def _num(x: float) -> float | None:
    return None if math.isnan(x) else round(float(x), 6)


def to_jsonable(rows: Sequence[GroupResult], spec: BootstrapSpec) -> dict[str, Any]:
    """The ``groups`` and ``bootstrap`` sections of a metrics JSON (null for undefined)."""
    out: list[dict[str, Any]] = []
    for r in rows:
        row: dict[str, Any] = {
            "grouping": r.grouping,
            "group": r.name,
            "volumes": r.volumes,
            "participants": r.participants,
            "too_small": r.too_small,
        }
        if r.too_small is None:
            row["metrics"] = {
                name: {
                    "value": _num(i.value),
                    "ci_low": _num(i.low),
                    "ci_high": _num(i.high),
                    "valid_resamples": i.valid,
                }
                for name, i in r.metrics.items()
            }
        out.append(row)
    return {
        "bootstrap": {
            "unit": "participant",
            "resamples": spec.resamples,
            "seed": spec.seed,
            "confidence": spec.confidence,
            "min_participants": spec.min_participants,
            "interval": "percentile",
        },
        "groups": out,
    }


def by_grouping(rows: Sequence[GroupResult]) -> Mapping[str, list[GroupResult]]:
    """Rows keyed by grouping, in report order."""
    out: dict[str, list[GroupResult]] = {}
    for r in rows:
        out.setdefault(r.grouping, []).append(r)
    return out
