"""Validation that neither lies nor hangs, on one process or many, for every job.

What goes wrong with the usual recipe (DistributedSampler + mean of per-rank metrics):

* the sampler pads the split with duplicates so every rank gets the same count, and those
  duplicates count twice (balanced accuracy inflated on small splits);
* a rank with fewer (or zero) batches leaves the others waiting in a collective forever;
* the mean of per-rank accuracies is not the accuracy.

What this module does instead (with ``data/loaders.py``'s padded shards):

* **reduce sums, indexed by sample**: a job's ``rows_fn`` turns a device batch into one row per
  sample (probabilities and label, or a loss and pooled features); ``collect`` adds
  ``[row, 1] * valid`` into row ``index`` of an ``(n, width + 1)`` table, and one step-sum
  reduction (``Backend.reduce_step_sum``) gives every process every sample's row. The count
  column must then be exactly 1 in every row - the exact-once invariant, checked, so a duplicate
  or a lost sample is an error, not a silently wrong number;
* **failures are agreed on**: a process whose local loop raises logs the traceback, zeroes its
  contribution and still joins the reductions, then ``hosts.agree`` with its failure, so no
  process hangs and all of them raise the same ``ValidationError`` with its message. With more
  than one process the hosts also agree before each batch (``agreed_batches``: one host sum
  per validation batch), so all stop together at the batch that failed: under SPMD every
  batch's forward is one program across the hosts (a host whose loader fails cannot skip to
  the reductions), and the same agreement carries a pod's Ctrl-C (``runtime/hosts.py``), so
  no host is left in a validation the others left. DINO's validation (every host reads every
  field, ``eval/cellpainting/profile_run.py``) agrees through the same helper. On XLA
  the loader's error crosses torch_xla's loader thread as an item (``runtime/handoff.py``), so
  it arrives here with its cause instead of as a quietly shorter pass.

No ``.item()`` runs inside the loop; batches arrive through ``Backend.wrap_loader`` like training
batches, so under SPMD they are global arrays sharded over the devices.
"""

from __future__ import annotations

import logging
import math
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from octtrain.errors import OcttrainError
from octtrain.runtime import hosts
from octtrain.runtime.backend import Backend
from octtrain.runtime.interrupt import check_interrupted

log = logging.getLogger(__name__)

LABEL_KEY = "label"  # octtrain.data.dataset.ManifestDataset's item layout
T = TypeVar("T")


class ValidationError(OcttrainError):
    """Validation failed on at least one process, or broke the exact-once invariant."""


class _Agreed(ValidationError):
    """A failure every process has already agreed on: raised on all of them at once."""


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


RowsFn = Callable[[dict[str, Any]], torch.Tensor]


def collect(
    rows_fn: RowsFn,
    batches: Iterable[dict[str, Any]],
    backend: Backend,
    n: int,
    width: int,
    models: Sequence[nn.Module] = (),
) -> npt.NDArray[np.float64]:
    """Every sample's row ``(n, width)``, exactly once across processes, on every process.

    ``models`` are put in eval mode for the pass and restored after. Raises ``ValidationError``
    (on every process alike) when any process failed or the exact-once check does not hold.
    """
    table = torch.zeros(n, width + 1, device=backend.device)
    failure: ValidationError | None = None
    modes = [m.training for m in models]
    for m in models:
        m.eval()
    iterator: Iterator[dict[str, Any]] = iter(batches)
    if backend.process_count > 1:
        iterator = agreed_batches(iterator, backend, lambda: failure)
    try:
        with torch.no_grad():
            for batch in iterator:
                check_interrupted()  # a Ctrl-C dropped while the loader started its workers
                try:
                    with backend.autocast():
                        rows = rows_fn(batch)
                    valid = batch["valid"].float()[:, None]
                    counted = torch.cat([rows.float(), torch.ones_like(valid)], dim=1) * valid
                    table.index_add_(0, batch["index"].long(), counted)
                    backend.sync()
                except Exception as exc:
                    if backend.process_count == 1:
                        raise
                    # Not the reductions now: the others are in the next batch's agreement,
                    # which this failure stops (``pending``) before any other forward here.
                    failure = local_failure(backend, exc)
                    table.zero_()
    except _Agreed:
        raise  # every process raises here, at the same batch: no reduction left to join
    except Exception as exc:  # noqa: BLE001 - any local failure must still reach the reductions
        log.error(
            "validation failed on process %d; joining the reduction with a failure flag:\n%s",
            backend.process_index,
            traceback.format_exc(),
        )
        table.zero_()
        failure = ValidationError(f"validation failed on process {backend.process_index}: {exc}")
    finally:
        release(iterator)
        for m, mode in zip(models, modes, strict=True):
            m.train(mode)
    reduced = backend.reduce_step_sum(table).cpu().double().numpy()
    hosts.agree(backend, failure, "in validation", kind=ValidationError)
    counts = reduced[:, -1]
    if not np.allclose(counts, 1.0):
        dup = int((counts > 1.5).sum())
        lost = int((counts < 0.5).sum())
        raise ValidationError(
            f"validation broke the exact-once invariant: {dup} sample(s) counted more than once, "
            f"{lost} never counted (of {n})"
        )
    return np.asarray(reduced[:, :-1], dtype=np.float64)


def local_failure(backend: Backend, exc: Exception) -> ValidationError:
    """A failure of this process alone (a CUDA OOM in its forward, a bug in its metrics) as the
    ``ValidationError`` it carries into the next agreement, its traceback logged here."""
    log.error(
        "validation failed on process %d; the next agreement stops every process:\n%s",
        backend.process_index,
        traceback.format_exc(),
    )
    if isinstance(exc, ValidationError):
        return exc
    return ValidationError(
        f"validation failed on process {backend.process_index}: {type(exc).__name__}: {exc}"
    )


def agreed_batches(
    batches: Iterable[T],
    backend: Backend,
    pending: Callable[[], ValidationError | None] = lambda: None,
) -> Iterator[T]:
    """``batches``, each yielded only once every process has loaded its own share of it; a
    process that failed to load it, or whose work on an earlier batch failed (``pending``: its
    forward, say), makes every process raise its message (``_Agreed``, a ``ValidationError``)
    at that agreement (the last batch's: the caller agrees once more after the pass). Every
    process must have as many batches (padded shards; the same fields
    on every host)."""
    iterator = iter(batches)
    number = 0
    try:
        while True:
            number += 1
            failure: _Agreed | None = None
            earlier = pending()
            if earlier is not None:
                failure = _Agreed(str(earlier))
            try:
                batch = next(iterator)
            except StopIteration:
                # Padded shards: every process runs out after the same batch. A failure in the
                # last batch's work is the caller's final agreement's (``collect``'s).
                return
            except Exception as exc:  # noqa: BLE001 - any loader failure must reach the others
                log.error(
                    "validation batch %d failed to load on process %d:\n%s",
                    number,
                    backend.process_index,
                    traceback.format_exc(),
                )
                failure = _Agreed(f"validation failed on process {backend.process_index}: {exc}")
            hosts.agree(backend, failure, f"at validation batch {number}", kind=_Agreed)
            yield batch
    finally:
        release(iterator)


def release(batches: Iterator[Any]) -> None:
    """End a pass over ``batches`` now, wherever it stopped: close the generator, which
    releases its loader (``Backend.wrap_loader``: the DataLoader's workers, torch_xla's loader
    thread and the batches it holds on the device). A validation that failed must not leave
    them waiting until the garbage collector finds the failure's reference cycle (a loader per
    failed validation, ~4 batches on every device of a pod, until the run ends)."""
    close = getattr(batches, "close", None)
    if close is not None:
        close()


def predict(
    model: nn.Module,
    batches: Iterable[dict[str, Any]],
    backend: Backend,
    n: int,
    num_classes: int,
    to_input: Callable[[dict[str, Any]], torch.Tensor],
) -> Predictions:
    """A classifier's probabilities for every sample, exactly once across processes.

    ``model`` should be the unwrapped module (no DDP hooks: a forward pass must not issue
    collectives that a process with fewer real samples would not match).
    """

    def rows(batch: dict[str, Any]) -> torch.Tensor:
        probs = torch.softmax(model(to_input(batch)).float(), dim=-1)
        return torch.cat([probs, batch[LABEL_KEY].float()[:, None]], dim=1)

    table = collect(rows, batches, backend, n, num_classes + 1, models=[model])
    labels = np.rint(table[:, num_classes]).astype(np.int64)
    return Predictions(probs=table[:, :num_classes], labels=labels)
