"""What finetuning needs from the manifest: checked splits, class counts and weights, samplers.

* Splits come from the manifest (``recommended_split``). A participant in two splits leaks
  test information into training and is an error, as is a volume whose label disagrees with
  its study group's position in ``manifest.classes``.
* ``auto`` class weights are ``n / (C * n_c)`` over the training split: a class with half the
  average count weighs 2, and a balanced split gives all ones.
* The training sampler yields ``(index, seed)`` pairs (octtrain.data's keyed augmentation) in
  whole epochs of ``steps * batch`` items, so an epoch ends at a batch boundary; with
  ``balanced`` the indices are drawn with equal class probability (with replacement).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from torch.utils.data import DataLoader, Sampler

from octstage.manifest import Manifest
from octtrain.data import ManifestDataset, Transform, volume_shape
from octtrain.errors import ConfigError, DataError
from octtrain.finetune_config import FinetuneConfig, LossConfig
from octtrain.validation import padded_loader


@dataclass(frozen=True)
class SplitSummary:
    """Volume and participant counts per split and class."""

    classes: tuple[str, ...]
    volumes: dict[str, list[int]]  # split -> count per class
    participants: dict[str, int]  # split -> participants


def check_splits(manifest: Manifest, needed: Sequence[str]) -> SplitSummary:
    """Refuse leaking or mislabelled manifests; count what each split holds.

    ``needed`` splits must not be empty. Raises ``DataError`` naming the participants at fault.
    """
    classes = manifest.classes
    if not classes:
        raise DataError("the manifest lists no classes")
    seen: dict[str, set[str]] = {}
    bad_labels: list[str] = []
    for v in manifest.volumes:
        seen.setdefault(v.participant_id, set()).add(v.split)
        if v.study_group not in classes or classes.index(v.study_group) != v.label:
            bad_labels.append(f"{v.participant_id} ({v.study_group!r} labelled {v.label})")
    leaks = sorted(pid for pid, splits in seen.items() if len(splits) > 1)
    if leaks:
        detail = ", ".join(f"{pid} in {sorted(seen[pid])}" for pid in leaks[:10])
        raise DataError(
            f"{len(leaks)} participant(s) appear in more than one split: {detail}; "
            "splits must be disjoint by participant (participants.tsv recommended_split)"
        )
    if bad_labels:
        raise DataError(
            f"{len(bad_labels)} volume(s) whose label is not the index of their study group in "
            f"manifest.classes {list(classes)}: {', '.join(bad_labels[:10])}"
        )
    volumes: dict[str, list[int]] = {}
    participants: dict[str, int] = {}
    for split in sorted({v.split for v in manifest.volumes} | set(needed)):
        vols = manifest.split(split)
        volumes[split] = np.bincount([v.label for v in vols], minlength=len(classes)).tolist()
        participants[split] = len({v.participant_id for v in vols})
    empty = [s for s in needed if not sum(volumes[s])]
    if empty:
        raise DataError(f"split(s) {empty} have no volumes in the manifest")
    return SplitSummary(tuple(classes), volumes, participants)


def class_weights(cfg: LossConfig, train_counts: Sequence[int]) -> npt.NDArray[np.float64] | None:
    """Loss weights per class, or None for an unweighted loss.

    ``auto`` gives a class absent from training a weight of 0: it has no samples to weigh,
    and the absence itself is reported loudly by the caller.
    """
    counts = np.asarray(train_counts, dtype=np.float64)
    if cfg.class_weights == "none":
        return None
    if cfg.class_weights == "manual":
        if len(cfg.class_weight_values) != counts.size:
            raise DataError(
                f"loss.class_weight_values has {len(cfg.class_weight_values)} values for "
                f"{counts.size} classes"
            )
        return np.asarray(cfg.class_weight_values, dtype=np.float64)
    present = counts > 0
    weights = np.zeros_like(counts)
    weights[present] = counts.sum() / (present.sum() * counts[present])
    return weights


def balanced_probabilities(labels: Sequence[int], num_classes: int) -> npt.NDArray[np.float64]:
    """Per-sample draw probabilities giving every present class the same total probability."""
    y = np.asarray(labels, dtype=np.int64)
    counts = np.bincount(y, minlength=num_classes).astype(np.float64)
    p = 1.0 / counts[y]
    return np.asarray(p / p.sum(), dtype=np.float64)


class EpochSampler(Sampler[tuple[int, int]]):
    """Endless ``(index, seed)`` pairs for one process, ``per_epoch`` items per epoch.

    Epoch ``e`` draws from a generator seeded by ``(seed, e)``: a permutation of the dataset,
    or ``n`` draws with replacement from ``probabilities`` (balanced sampling). The draw is cut
    into disjoint strided shards, each ``per_epoch`` long. Item seeds depend on
    ``(seed, e, position)``, so the stream is a pure function of the arguments.
    """

    def __init__(
        self,
        n: int,
        per_epoch: int,
        process_index: int,
        process_count: int,
        seed: int,
        probabilities: npt.NDArray[np.float64] | None = None,
        start_epoch: int = 0,
    ) -> None:
        if per_epoch <= 0 or (per_epoch * process_count > n and probabilities is None):
            raise DataError(
                f"{n} training volumes cannot give {process_count} process(es) "
                f"{per_epoch} items per epoch"
            )
        self.n, self.per_epoch, self.seed = n, per_epoch, seed
        self.process_index, self.process_count = process_index, process_count
        self.probabilities = probabilities
        self.start_epoch = start_epoch

    def epoch_indices(self, epoch: int) -> npt.NDArray[np.int64]:
        """This process's indices for one epoch."""
        rng = np.random.default_rng([self.seed, epoch])
        if self.probabilities is None:
            draw = rng.permutation(self.n)
        else:
            total = self.per_epoch * self.process_count
            draw = rng.choice(self.n, size=max(total, self.n), p=self.probabilities)
        mine = draw[self.process_index :: self.process_count][: self.per_epoch]
        return np.asarray(mine, dtype=np.int64)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.start_epoch
        while True:
            item_seeds = np.random.default_rng([self.seed, epoch, 1]).integers(
                2**31, size=self.per_epoch
            )
            for i, s in zip(self.epoch_indices(epoch), item_seeds, strict=True):
                yield int(i), int(s)
            epoch += 1


@dataclass
class FinetuneData:
    """The datasets and loaders of one process, and the epoch's length."""

    train_set: ManifestDataset
    val_set: ManifestDataset
    train_loader: DataLoader[dict[str, Any]]  # endless, whole epochs of steps * accum batches
    val_loader: DataLoader[dict[str, Any]]  # this process's padded validation shard
    steps: int  # optimizer steps per epoch
    batch: int  # samples per micro-batch on this process
    train_counts: list[int]  # training volumes per class


def build_data(
    cfg: FinetuneConfig, manifest: Manifest, process_index: int, process_count: int
) -> FinetuneData:
    """Datasets and loaders for a resolved config (``model.input_shape`` set)."""
    d, shape = cfg.data, cfg.model.input_shape
    assert shape is not None and d.manifest is not None
    cached = volume_shape(manifest.split(d.train_split) + manifest.split(d.val_split))
    if any(w > s for w, s in zip(shape, cached, strict=True)):
        raise DataError(f"model input {list(shape)} exceeds the cached volumes {list(cached)}")
    if d.batch_size % process_count:
        raise ConfigError(f"data.batch_size {d.batch_size} is not divisible by {process_count}")
    batch = d.batch_size // process_count
    root = Path(d.cache) if d.cache else Path(d.manifest).parent
    train = ManifestDataset(
        manifest, root, d.train_split, Transform(shape, d.augment), d.max_samples
    )
    val = ManifestDataset(manifest, root, d.val_split, Transform(shape, None), d.max_samples)
    steps = len(train) // (d.batch_size * cfg.accum_steps)
    if steps == 0:
        raise ConfigError(
            f"{len(train)} training volumes are fewer than one effective batch "
            f"({d.batch_size} x {cfg.accum_steps}); lower data.batch_size or effective_batch_size"
        )
    labels = [v.label for v in train.volumes]
    classes = len(manifest.classes)
    sampler = EpochSampler(
        len(train),
        steps * cfg.accum_steps * batch,
        process_index,
        process_count,
        cfg.train.seed,
        balanced_probabilities(labels, classes) if cfg.train.balanced_sampling else None,
    )
    workers: dict[str, Any] = {"num_workers": d.num_workers}
    if d.num_workers:
        workers |= {"persistent_workers": True, "prefetch_factor": d.prefetch_factor}
    train_loader: DataLoader[dict[str, Any]] = DataLoader(
        train, batch_size=batch, sampler=sampler, drop_last=True, **workers
    )
    val_batch = cfg.validation.batch_size or batch
    val_loader = padded_loader(
        val, len(val), process_index, process_count, val_batch, num_workers=d.num_workers
    )
    counts = np.bincount(labels, minlength=classes).tolist()
    return FinetuneData(train, val, train_loader, val_loader, steps, batch, counts)
