"""Per-group means of item embeddings, streamed (pure numpy: rows in, finished groups out).

A well's (a participant's) row is the mean of its items' embeddings. The manifest says how many
items each group has (``expected``), so a group is finished, and handed out, the moment its last
item arrives: memory holds only the groups in flight, which for a cache built plate after plate
is a plate's wells, not the million fields' (a manifest in another order holds more, never
wrong). Sums are float64; a group that never completes is an error of the caller (``close``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class _Sum:
    carried: Any  # what the group's first item says of it (its carried columns)
    total: np.ndarray
    count: int = 0


@dataclass
class GroupMeans:
    """Means per group key, each handed out when the group's ``expected`` count is reached."""

    expected: dict[Hashable, int]
    open: dict[Hashable, _Sum] = field(default_factory=dict)

    def add(
        self, keys: Sequence[Hashable], x: np.ndarray, carried: Sequence[Any]
    ) -> Iterator[tuple[Hashable, Any, np.ndarray, int]]:
        """Add rows ``x`` ``[n, dim]`` of groups ``keys``; yields ``(key, carried of its first
        item, mean, count)`` for each group this completes, in completion order."""
        for i, key in enumerate(keys):
            group = self.open.get(key)
            if group is None:
                if key not in self.expected:
                    raise ValueError(f"an item of group {key!r}, which the manifest does not list")
                group = self.open[key] = _Sum(carried[i], np.zeros(x.shape[1], np.float64))
            group.total += x[i]
            group.count += 1
            if group.count == self.expected[key]:
                del self.open[key]
                yield key, group.carried, group.total / group.count, group.count

    def close(self) -> None:
        """ValueError naming a group that received fewer items than expected."""
        if self.open:
            key, group = next(iter(self.open.items()))
            raise ValueError(
                f"{len(self.open)} groups incomplete, e.g. {key!r}: {group.count} of "
                f"{self.expected[key]} items"
            )


def group_counts(keys: Sequence[Hashable]) -> dict[Hashable, int]:
    """How many items each group key has."""
    counts: dict[Hashable, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return counts
