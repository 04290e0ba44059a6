"""Bootstrap confidence intervals resampled by cluster (participant): pure numpy, no I/O.

Volumes of one participant (both eyes, several devices, repeated scans) are not independent: a
participant whose disease the model misses is usually missed in every volume. Resampling volumes
would count each participant's volumes as separate evidence and narrow the interval the more
volumes a participant has; resampling *participants* (each draw takes all of a participant's
volumes) gives an interval that duplicating volumes cannot narrow.

Each resample draws as many clusters as there are, with replacement, from one generator
seeded by ``(seed, stream)``: the same seed and stream give the same interval on any machine
with the same numpy. A resample where the metric is undefined (a class missing from the draw,
for AUROC) is skipped and counted; the interval is the percentile interval of the rest.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

# Item indices (repeats allowed) -> a vector of metrics on those items.
MetricFn = Callable[[npt.NDArray[np.int64]], npt.NDArray[np.float64]]


@dataclass(frozen=True)
class Interval:
    """A point estimate with its percentile bootstrap interval (``nan`` where undefined)."""

    value: float
    low: float
    high: float
    resamples: int  # resamples drawn
    valid: int  # resamples where the metric was defined

    @property
    def width(self) -> float:
        return self.high - self.low


def stream_of(name: str) -> int:
    """A stable integer for a group's name (Python's ``hash`` of a str changes per process)."""
    return zlib.crc32(name.encode("utf-8"))


def cluster_members(clusters: Sequence[str]) -> list[npt.NDArray[np.int64]]:
    """Indices of each cluster's members, clusters in sorted order of their ids."""
    index: dict[str, list[int]] = {}
    for i, c in enumerate(clusters):
        index.setdefault(c, []).append(i)
    return [np.asarray(index[c], dtype=np.int64) for c in sorted(index)]


def bootstrap(
    metric: MetricFn,
    clusters: Sequence[str] | None,
    n: int,
    resamples: int,
    seed: int,
    stream: int = 0,
    confidence: float = 0.95,
) -> list[Interval]:
    """Each of ``metric``'s values on all ``n`` items, with its bootstrap interval.

    ``metric`` maps item indices (with repeats) to a vector of metrics, so one draw serves
    them all. ``clusters[i]`` is item i's cluster (participant id): a resample draws whole
    clusters. ``clusters`` None resamples items one by one (the per-volume bootstrap the
    participant bootstrap guards against; right for participant-level data, where each item is
    its own cluster).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if clusters is not None and len(clusters) != n:
        raise ValueError(f"clusters has {len(clusters)} entries for {n} items")
    values = np.asarray(metric(np.arange(n, dtype=np.int64)), dtype=np.float64)
    members = (
        [np.asarray([i], dtype=np.int64) for i in range(n)]
        if clusters is None
        else cluster_members(clusters)
    )
    rng = np.random.default_rng([seed, stream])
    scores = np.full((resamples, values.size), np.nan)
    if members:
        for r in range(resamples):
            picks = rng.integers(0, len(members), size=len(members))
            scores[r] = metric(np.concatenate([members[k] for k in picks]))
    tail = (1.0 - confidence) / 2.0 * 100.0
    out = []
    for j, value in enumerate(values):
        column = scores[:, j]
        finite = column[~np.isnan(column)]
        if finite.size == 0 or math.isnan(value):
            out.append(Interval(float(value), math.nan, math.nan, resamples, int(finite.size)))
            continue
        low, high = np.percentile(finite, [tail, 100.0 - tail])
        out.append(Interval(float(value), float(low), float(high), resamples, int(finite.size)))
    return out
