"""Manifest-fed volumes: a dataset that opens only the arrays the manifest lists, and its loaders.

``ManifestDataset`` never lists a folder and never calls out: each item is one
``zarr.open_array`` of ``cache_root / volume.array_path`` (reading its ``zarr.json`` and its one
shard). Items are float tensors ``[1, D, H, W]`` scaled to [-1, 1], cropped to the model's input
shape, augmented cheaply in the loader workers.

Randomness is keyed, not stateful: the training sampler yields ``(index, seed)`` pairs, and the
augmentation of an item depends only on that seed. The stream of pairs is a pure function of
(seed, process, position), so a resumed run sees exactly the batches an uninterrupted one would,
whatever the number of workers.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr
from torch.utils.data import DataLoader, Dataset, Sampler

from octstage.errors import ManifestError
from octstage.manifest import Manifest, Volume
from octstage.manifest import load as load_manifest
from octtrain.config import AugmentConfig, DataConfig
from octtrain.errors import ConfigError, DataError

SampleKey = int | tuple[int, int]  # index, or (index, augmentation seed)


def read_manifest(path: str | None) -> Manifest:
    """The run's manifest from local disk, its versions checked; a clear error otherwise."""
    if path is None:
        raise ConfigError("data.manifest is not set (use --manifest FILE)")
    try:
        return load_manifest(path)
    except ManifestError as exc:
        raise DataError(str(exc)) from exc


class Transform:
    """Crop to ``out_shape`` (random or centre), flips, brightness/contrast; uint8 in, float out.

    With ``augment`` None the transform is deterministic: centre crop, no jitter (evaluation).
    """

    def __init__(self, out_shape: tuple[int, int, int], augment: AugmentConfig | None) -> None:
        self.out_shape = out_shape
        self.augment = augment

    def __call__(self, volume: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
        aug = self.augment if rng is not None else None
        starts = []
        for size, out in zip(volume.shape, self.out_shape, strict=True):
            if out > size:
                raise DataError(
                    f"volume shape {volume.shape} is smaller than crop {self.out_shape}"
                )
            if aug is not None and aug.random_crop and rng is not None:
                starts.append(int(rng.integers(0, size - out + 1)))
            else:
                starts.append((size - out) // 2)
        d, h, w = starts
        od, oh, ow = self.out_shape
        crop = volume[d : d + od, h : h + oh, w : w + ow]
        gain, shift = 1.0, 0.0
        if aug is not None and rng is not None:
            if rng.random() < aug.flip_w:
                crop = crop[:, :, ::-1]
            if rng.random() < aug.flip_d:
                crop = crop[::-1]
            gain = 1.0 + rng.uniform(-aug.contrast, aug.contrast)
            shift = rng.uniform(-aug.brightness, aug.brightness)
        # (v * 2/255 - 1) * gain + shift, as one copy and two in-place passes: the float
        # volume is the largest array a worker touches (temporaries doubled the item time).
        x = crop.astype(np.float32, order="C")
        x *= np.float32(2.0 / 255.0 * gain)
        x += np.float32(shift - gain)
        return x


class ManifestDataset(Dataset[dict[str, Any]]):
    """The volumes of one split of a manifest, read from a local cache folder.

    ``dataset[i]`` is deterministic (no augmentation); ``dataset[(i, seed)]`` augments with a
    generator seeded by ``seed``. Items: ``image`` float32 ``[1, D, H, W]``, ``label`` int,
    ``index`` int (position in this dataset), ``participant_id`` str.
    """

    def __init__(
        self,
        manifest: Manifest,
        cache_root: str | Path,
        split: str | None,
        transform: Transform | None = None,
        max_samples: int | None = None,
    ) -> None:
        volumes = manifest.volumes if split is None else manifest.split(split)
        self.volumes: tuple[Volume, ...] = volumes[:max_samples]
        self.cache_root = Path(cache_root)
        self.transform = transform
        self.split = split

    def __len__(self) -> int:
        return len(self.volumes)

    def read(self, index: int) -> np.ndarray:
        """The stored uint8 array of volume ``index``; only its listed path is opened."""
        v = self.volumes[index]
        path = self.cache_root / v.array_path
        try:
            array = zarr.open_array(store=str(path), mode="r", zarr_format=3)
            data = np.asarray(array[...])
        except (FileNotFoundError, OSError, ValueError) as exc:
            raise DataError(
                f"{path}: cannot read cached volume of participant {v.participant_id}: {exc}; "
                "run `octstage verify` on the manifest"
            ) from exc
        if data.shape != tuple(v.shape):
            raise DataError(f"{path}: shape {data.shape} differs from the manifest's {v.shape}")
        return data

    def __getitem__(self, key: SampleKey) -> dict[str, Any]:
        index, seed = (key, None) if isinstance(key, int) else key
        volume = self.read(index)
        v = self.volumes[index]
        transform = self.transform or Transform(v.shape, None)  # none given: scale only
        image = transform(volume, None if seed is None else np.random.default_rng(seed))
        return {
            "image": torch.from_numpy(image)[None],
            "label": v.label,
            "index": index,
            "participant_id": v.participant_id,
        }


def volume_shape(volumes: Sequence[Volume]) -> tuple[int, int, int]:
    """The one shape shared by ``volumes``; DataError when the cache mixes shapes or is empty."""
    shapes = {tuple(v.shape) for v in volumes}
    if len(shapes) != 1:
        raise DataError(f"expected one volume shape in the cache, found {sorted(shapes) or 'none'}")
    d, h, w = shapes.pop()
    return (d, h, w)


def shard(n: int, process_index: int, process_count: int) -> list[int]:
    """This process's positions of ``range(n)``: disjoint across processes, together complete."""
    return list(range(process_index, n, process_count))


class TrainSampler(Sampler[tuple[int, int]]):
    """An endless stream of ``(index, seed)`` for one process, starting at ``start`` items.

    Each epoch is a permutation of the dataset seeded by (seed, epoch), cut into equal disjoint
    shards (the remainder is dropped that epoch). Item seeds depend on (seed, epoch, index).
    """

    def __init__(
        self, n: int, process_index: int, process_count: int, seed: int, start: int = 0
    ) -> None:
        self.n, self.seed, self.start = n, seed, start
        self.process_index, self.process_count = process_index, process_count
        self.per_epoch = n // process_count
        if self.per_epoch == 0:
            raise DataError(f"{n} training volumes cannot be shared by {process_count} processes")

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch, offset = divmod(self.start, self.per_epoch)
        for e in itertools.count(epoch):
            perm = np.random.default_rng([self.seed, e]).permutation(self.n)
            mine = perm[self.process_index :: self.process_count][: self.per_epoch]
            for i in mine[offset:]:
                seed = int(np.random.default_rng([self.seed, e, int(i)]).integers(2**31))
                yield int(i), seed
            offset = 0


def _loader_kwargs(cfg: DataConfig) -> dict[str, Any]:
    if cfg.num_workers == 0:
        return {"num_workers": 0}
    return {
        "num_workers": cfg.num_workers,
        "prefetch_factor": cfg.prefetch_factor,
        "persistent_workers": cfg.persistent_workers,
        "pin_memory": cfg.pin_memory,
    }


def train_loader(
    dataset: ManifestDataset,
    cfg: DataConfig,
    batch_size: int,
    process_index: int,
    process_count: int,
    seed: int,
    start_step: int = 0,
) -> DataLoader[dict[str, Any]]:
    """Endless batches of ``batch_size`` for this process, resuming after ``start_step`` steps."""
    sampler = TrainSampler(
        len(dataset), process_index, process_count, seed, start=start_step * batch_size
    )
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=True,
        **_loader_kwargs(cfg),
    )


def eval_loader(
    dataset: ManifestDataset,
    cfg: DataConfig,
    batch_size: int,
    process_index: int,
    process_count: int,
) -> DataLoader[dict[str, Any]]:
    """One pass over this process's disjoint shard, in order; the last batch may be short."""
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=shard(len(dataset), process_index, process_count),
        drop_last=False,
        **_loader_kwargs(cfg),
    )


def pad_batch(batch: dict[str, Any], size: int) -> dict[str, Any]:
    """Pad a short batch to ``size`` (static shapes) by repeating its first item; ``valid`` marks
    real rows (float 1/0), so sums over valid rows stay exact."""
    n = batch["image"].shape[0]
    out = dict(batch)
    out["valid"] = torch.cat([torch.ones(n), torch.zeros(size - n)])
    if n == size:
        return out
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            filler = value[:1].expand(size - n, *value.shape[1:])
            out[key] = torch.cat([value, filler])
        elif isinstance(value, list):
            out[key] = value + [value[0]] * (size - n)
    return out


class Prefetcher(Iterator[dict[str, Any]]):
    """Pulls batches from a loader in a background thread, ``depth`` batches ahead.

    Receiving a batch from DataLoader workers costs a few milliseconds of IPC even when it is
    ready (measured here: ~6 ms per batch on a busy 2-core VM, zero-cost items); the thread
    pays it while the step computes, so the loop's measured data wait is real waiting only.
    Errors raised by the loader are re-raised by ``next``.
    """

    _END = object()

    def __init__(self, loader: Iterable[dict[str, Any]], depth: int = 2) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        # The loader's iterator (and its worker processes) is made here, on the calling thread:
        # DataLoader installs its worker-failure signal handler only from the main thread.
        self._thread = threading.Thread(
            target=self._run, args=(iter(loader),), name="batch-prefetch", daemon=True
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
        item = self._queue.get()
        if item is self._END:
            raise StopIteration
        if isinstance(item, Exception):
            raise item
        batch: dict[str, Any] = item
        return batch

    def close(self) -> None:
        """Stop after the batch in flight (the loader's workers end with it)."""
        self._stop.set()
        self._thread.join(timeout=60)
