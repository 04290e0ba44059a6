"""Samplers: one process's share of the global sampling order, as ``(index, seed)`` pairs.

Epoch ``e`` draws one global order from a generator seeded by ``(seed, e)``: a permutation of the
dataset, or draws with replacement from ``probabilities`` (balanced sampling). Process ``p`` of
``P`` takes positions ``p, p + P, p + 2P, ...`` of it, ``per_epoch`` of them, so the processes'
batches of step ``t`` together are exactly the global order's ``t``-th slice of ``P * batch``
samples. The seed of an item (its crop, flips, intensity jitter and mask) depends on
``(seed, e, global position)`` only: every host agrees on it, and the global batch's samples and
masks are the same whatever the number of hosts. The stream is a pure function of its
arguments, so a run resumed at item ``start`` sees what an uninterrupted one would.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt
from torch.utils.data import Sampler

from octtrain.errors import DataError


def shard(n: int, process_index: int, process_count: int) -> list[int]:
    """This process's positions of ``range(n)``: strided, disjoint, together complete."""
    if not 0 <= process_index < process_count:
        raise ValueError(f"process {process_index} outside {process_count} processes")
    return list(range(process_index, n, process_count))


def balanced_probabilities(labels: Sequence[int], num_classes: int) -> npt.NDArray[np.float64]:
    """Per-sample draw probabilities giving every present class the same total probability."""
    y = np.asarray(labels, dtype=np.int64)
    counts = np.bincount(y, minlength=num_classes).astype(np.float64)
    p = 1.0 / counts[y]
    return np.asarray(p / p.sum(), dtype=np.float64)


def item_seed(seed: int, epoch: int, position: int) -> int:
    """The seed of the item at global ``position`` of epoch ``epoch`` (shared by all hosts)."""
    return int(np.random.default_rng([seed, epoch, position]).integers(2**31))


class EpochSampler(Sampler[tuple[int, int]]):
    """Endless ``(index, seed)`` pairs for one process, ``per_epoch`` items per epoch.

    ``per_epoch`` None means as many as every process can get from one permutation
    (``n // process_count``; the remainder of the epoch is dropped). ``start`` skips that many
    of this process's items (resume).
    """

    def __init__(
        self,
        n: int,
        process_index: int,
        process_count: int,
        seed: int,
        per_epoch: int | None = None,
        probabilities: npt.NDArray[np.float64] | None = None,
        start: int = 0,
    ) -> None:
        per_epoch = n // process_count if per_epoch is None else per_epoch
        if per_epoch <= 0 or (per_epoch * process_count > n and probabilities is None):
            raise DataError(
                f"{n} training volumes cannot give {process_count} process(es) "
                f"{per_epoch} items per epoch"
            )
        self.n, self.per_epoch, self.seed, self.start = n, per_epoch, seed, start
        self.process_index, self.process_count = process_index, process_count
        self.probabilities = probabilities

    def global_order(self, epoch: int) -> npt.NDArray[np.int64]:
        """The epoch's sample order over all processes."""
        rng = np.random.default_rng([self.seed, epoch])
        if self.probabilities is None:
            return np.asarray(rng.permutation(self.n), dtype=np.int64)
        total = max(self.per_epoch * self.process_count, self.n)
        return np.asarray(rng.choice(self.n, size=total, p=self.probabilities), dtype=np.int64)

    def epoch_items(self, epoch: int) -> list[tuple[int, int]]:
        """This process's ``(index, seed)`` pairs of one epoch."""
        return list(self._epoch(epoch, 0))

    def _epoch(self, epoch: int, offset: int) -> Iterator[tuple[int, int]]:
        """This process's pairs of one epoch from its ``offset``-th on, each seed drawn when
        the pair is: an epoch of a million fields would otherwise draw a million seeds (~10 s)
        and hold them as tuples before the first batch."""
        order = self.global_order(epoch)
        positions = range(self.process_index, len(order), self.process_count)
        for j in itertools.islice(positions, offset, self.per_epoch):
            yield int(order[j]), item_seed(self.seed, epoch, j)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch, offset = divmod(self.start, self.per_epoch)
        for e in itertools.count(epoch):
            yield from self._epoch(e, offset)
            offset = 0
