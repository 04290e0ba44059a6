"""Validation that neither lies nor hangs, on one process or many.

What goes wrong with the usual recipe (DistributedSampler + mean of per-rank metrics):

* the sampler pads the split with duplicates so every rank gets the same count, and those
  duplicates count twice (balanced accuracy inflated on small splits);
* a rank with fewer (or zero) batches leaves the others waiting in a collective forever;
* the mean of per-rank accuracies is not the accuracy.

What this module does instead:

* **shard without padding**: process ``r`` of ``p`` takes samples ``r, r + p, r + 2p, ...``;
* **static shapes**: every process runs the same number of full-size batches, computed from
  the split size alone (no collective needed to agree on it); places past the end of a shard
  are filled with a real sample whose ``valid`` flag is 0;
* **reduce sums, indexed by sample**: each process adds ``[probs, label, 1] * valid`` into row
  ``index`` of a ``(n, C + 2)`` buffer; one ``all_reduce_sum`` gives every process every
  sample's prediction. The count column must then be exactly 1 in every row - the exact-once
  invariant, checked, so a duplicate or a lost sample is an error, not a silently wrong number;
* **failures are agreed on**: a process whose local loop raises logs the traceback, zeroes its
  contribution and still joins the reduction with a failure flag, so no process hangs and all
  of them see the same outcome.

The one collective is ``Backend.all_reduce_sum``; no ``.item()`` runs inside the loop.
"""

from __future__ import annotations

import logging
import math
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from octtrain.device import Backend
from octtrain.errors import OcttrainError

log = logging.getLogger(__name__)

# Keys of a dataset item the loop reads (octtrain.data.ManifestDataset's item layout).
INPUT_KEY = "image"
LABEL_KEY = "label"


class ValidationError(OcttrainError):
    """Validation failed on at least one process, or broke the exact-once invariant."""


def shard(n: int, rank: int, world: int) -> list[int]:
    """The sample indices of process ``rank``: strided, no padding, possibly empty."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside world of {world}")
    return list(range(rank, n, world))


def steps_per_process(n: int, world: int, batch_size: int) -> int:
    """Batches every process runs: enough for the largest shard, identical on all processes."""
    if n == 0:
        return 0
    return math.ceil(math.ceil(n / world) / batch_size)


class PaddedShard(Dataset[dict[str, Any]]):
    """One process's shard, padded to ``steps * batch_size`` items with ``valid = 0`` fillers.

    Fillers repeat sample ``filler_index`` (a real item keeps the shapes static without a
    special case in the model); their rows are multiplied by 0 before the reduction.
    """

    def __init__(
        self,
        dataset: Dataset[dict[str, Any]],
        indices: Sequence[int],
        length: int,
        filler_index: int,
    ) -> None:
        if length < len(indices):
            raise ValueError(f"padded length {length} < shard size {len(indices)}")
        self.dataset = dataset
        self.indices = list(indices)
        self.length = length
        self.filler_index = filler_index

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, Any]:
        real = i < len(self.indices)
        index = self.indices[i] if real else self.filler_index
        item = dict(self.dataset[index])
        item["index"] = torch.tensor(index, dtype=torch.long)
        item["valid"] = torch.tensor(1.0 if real else 0.0)
        return item


def padded_loader(
    dataset: Dataset[dict[str, Any]],
    n: int,
    rank: int,
    world: int,
    batch_size: int,
    num_workers: int = 0,
    collate_fn: Callable[[list[dict[str, Any]]], dict[str, Any]] | None = None,
) -> DataLoader[dict[str, Any]]:
    """A loader over this process's padded shard: same number of full batches everywhere."""
    steps = steps_per_process(n, world, batch_size)
    padded = PaddedShard(dataset, shard(n, rank, world), steps * batch_size, filler_index=0)
    return DataLoader(
        padded,
        batch_size=batch_size,
        shuffle=False,
        drop_last=False,
        num_workers=num_workers,
        collate_fn=collate_fn,
    )


@dataclass(frozen=True)
class Predictions:
    """Every validation sample's probabilities and label, in dataset order."""

    probs: npt.NDArray[np.float64]  # (n, C)
    labels: npt.NDArray[np.int64]  # (n,)

    @property
    def nll(self) -> float:
        """Mean negative log-likelihood of the true class (the unweighted validation loss)."""
        if not self.labels.size:
            return math.nan
        p = self.probs[np.arange(self.labels.size), self.labels]
        return float(-np.log(np.clip(p, 1e-12, None)).mean())


def predict(
    model: nn.Module,
    batches: Iterable[dict[str, Any]],
    backend: Backend,
    n: int,
    num_classes: int,
    max_failures_logged: int = 1,
) -> Predictions:
    """Run ``model`` over this process's padded batches and reduce exactly once across processes.

    ``model`` should be the unwrapped module (no DDP hooks: a forward pass must not issue
    collectives that a process with fewer real samples would not match). Raises
    ``ValidationError`` when any process failed or the exact-once check does not hold; every
    process raises the same way, after the single collective.
    """
    width = num_classes + 2  # probs, label, count
    rows = torch.zeros(n, width, device=backend.device)
    failed = torch.zeros(1, device=backend.device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for batch in batches:
                with backend.autocast():
                    logits = model(batch[INPUT_KEY])
                probs = torch.softmax(logits.float(), dim=-1)
                valid = batch["valid"].float()[:, None]
                label = batch[LABEL_KEY].float()[:, None]
                contrib = torch.cat([probs, label, torch.ones_like(label)], dim=1) * valid
                rows.index_add_(0, batch["index"], contrib)
                backend.sync()
    except Exception:  # noqa: BLE001 - any local failure must still reach the collective below
        log.error(
            "validation failed on process %d; joining the reduction with a failure flag:\n%s",
            backend.rank,
            traceback.format_exc(),
        )
        rows.zero_()
        failed.fill_(1.0)
    finally:
        model.train(was_training)
    reduced = backend.all_reduce_sum(torch.cat([rows.flatten(), failed])).cpu().double().numpy()
    return _check_reduced(reduced, n, num_classes)


def _check_reduced(reduced: npt.NDArray[np.float64], n: int, num_classes: int) -> Predictions:
    failures = int(np.rint(reduced[-1]))
    if failures:
        raise ValidationError(f"validation failed on {failures} process(es); see the log above")
    table = reduced[:-1].reshape(n, num_classes + 2)
    counts = table[:, -1]
    if not np.allclose(counts, 1.0):
        dup = int((counts > 1.5).sum())
        lost = int((counts < 0.5).sum())
        raise ValidationError(
            f"validation broke the exact-once invariant: {dup} sample(s) counted more than once, "
            f"{lost} never counted (of {n})"
        )
    labels = np.rint(table[:, num_classes]).astype(np.int64)
    return Predictions(probs=table[:, :num_classes], labels=labels)


def gather_rows(
    backend: Backend, rows: torch.Tensor, extra: torch.Tensor
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Every process's ``rows`` (same shape everywhere) stacked in process order, and the sum
    of ``extra``, on the host. Each process writes into its own slot of a zero table and one
    ``all_reduce_sum`` assembles it: an all-gather built from the one collective we have."""
    table = torch.zeros(backend.process_count, *rows.shape, device=rows.device)
    table[backend.process_index] = rows
    packed = torch.cat([table.flatten(), extra.flatten()])
    reduced = backend.all_reduce_sum(packed).cpu().double().numpy()
    n = table.numel()
    return reduced[:n].reshape(-1, rows.shape[-1]), reduced[n:]
