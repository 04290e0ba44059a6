"""DataLoaders: endless training batches and padded validation shards, and a prefetch thread.

Training: ``EpochSampler`` pairs (``data/samplers.py``), ``drop_last`` for static shapes.
Validation: process ``r`` of ``p`` takes samples ``r, r + p, ...`` without padding them with
duplicates; every process runs the same number of full-size batches, computed from the split
size alone (no collective needed to agree on it), and places past the end of a shard are filled
with a real sample whose ``valid`` flag is 0 (its rows are multiplied by 0 before any reduction).
A process with no samples at all still runs its batches of fillers and joins every reduction.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.data import DataLoader, Dataset

from octstage.manifest import ctrl_c_deferred
from octtrain.config.sections import DataConfig
from octtrain.data.dataset import ManifestDataset
from octtrain.data.samplers import EpochSampler, shard
from octtrain.runtime.interrupt import check_interrupted, quiet_worker_echoes


def loader_kwargs(cfg: DataConfig) -> dict[str, Any]:
    """Worker settings of every loader of a run."""
    if cfg.num_workers == 0:
        return {"num_workers": 0}
    return {
        "num_workers": cfg.num_workers,
        "prefetch_factor": cfg.prefetch_factor,
        "persistent_workers": cfg.persistent_workers,
        "pin_memory": cfg.pin_memory,
        "worker_init_fn": quiet_worker_echoes,
    }


def train_loader(
    dataset: ManifestDataset,
    cfg: DataConfig,
    batch_size: int,
    process_index: int,
    process_count: int,
    seed: int,
    start_step: int = 0,
    per_epoch: int | None = None,
    probabilities: npt.NDArray[np.float64] | None = None,
) -> DataLoader[dict[str, Any]]:
    """Endless batches of ``batch_size`` for this process, resuming after ``start_step`` steps."""
    sampler = EpochSampler(
        len(dataset),
        process_index,
        process_count,
        seed,
        per_epoch=per_epoch,
        probabilities=probabilities,
        start=start_step * batch_size,
    )
    return DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, drop_last=True, **loader_kwargs(cfg)
    )


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
    cfg: DataConfig | None = None,
) -> DataLoader[dict[str, Any]]:
    """A loader over this process's padded shard: the same number of full batches everywhere
    (``cfg``: worker settings; None: in-process)."""
    steps = steps_per_process(n, world, batch_size)
    padded = PaddedShard(dataset, shard(n, rank, world), steps * batch_size, filler_index=0)
    workers = loader_kwargs(cfg) if cfg is not None else {"num_workers": 0}
    return DataLoader(padded, batch_size=batch_size, shuffle=False, drop_last=False, **workers)


class Prefetcher(Iterator[dict[str, Any]]):
    """Pulls batches from a loader in a background thread, ``depth`` batches ahead.

    Receiving a batch from DataLoader workers costs a few milliseconds of IPC even when it is
    ready (measured here: ~6 ms per batch on a busy 2-core VM, zero-cost items); the thread
    pays it while the step computes, so the loop's measured data wait is real waiting only.
    Errors raised by the loader are re-raised by ``next``. Once ``close`` was called, ``next``
    ends the iteration instead of waiting: a consumer thread (torch_xla's loader thread, which
    the backend joins at exit) must not wait forever for a batch nothing will put.
    """

    _END = object()

    def __init__(self, loader: Iterable[dict[str, Any]], depth: int = 2) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        # The loader's iterator (and its worker processes) is made here, on the calling thread:
        # DataLoader installs its worker-failure signal handler only from the main thread. A
        # Ctrl-C is held back until it is whole: one cut off half-built has no ``_workers`` to
        # shut down (a traceback from its ``__del__``) and could leave its queues' feeder threads
        # for the exit to wait on; a whole one is shut down when the interrupt drops it.
        with ctrl_c_deferred():
            batches = iter(loader)
        self._thread = threading.Thread(
            target=self._run, args=(batches,), name="batch-prefetch", daemon=True
        )
        self._thread.start()

    def _run(self, batches: Iterator[dict[str, Any]]) -> None:
        try:
            for batch in batches:
                if not self._put(batch):
                    return
            self._put(self._END)
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            self._put(exc)

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __next__(self) -> dict[str, Any]:
        item: Any = self._END
        while not self._stop.is_set():
            check_interrupted()  # a Ctrl-C Python dropped (in a __del__, a fork hook) ends here
            try:
                item = self._queue.get(timeout=0.1)
                break
            except queue.Empty:
                continue
        if item is self._END:
            raise StopIteration
        if isinstance(item, Exception):
            raise item
        batch: dict[str, Any] = item
        return batch

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop after the batch in flight (the loader's workers end with it), waiting for it at
        most ``timeout_s`` (the thread is a daemon: a batch stuck on a dead mount is left to
        the process exit)."""
        self._stop.set()
        self._thread.join(timeout=timeout_s)
