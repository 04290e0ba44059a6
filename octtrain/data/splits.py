"""What training needs from the manifest: checked splits, a batch the data fills, class counts
and loss weights.

* Splits come from the manifest (``recommended_split``). A participant in two splits leaks
  test information into training and is an error, as is a volume whose label disagrees with
  its study group's position in ``manifest.classes``.
* A batch larger than its split (after ``data.select`` and ``data.max_samples``) is refused by
  every job before its model is built: the sampler would fill it by repeating items (pretrain
  went on to allocate tens of GB, DINO stalled until the watchdog).
* ``auto`` class weights are ``n / (C * n_c)`` over the training split: a class with half the
  average count weighs 2, and a balanced split gives all ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from octstage.manifest import Manifest
from octtrain.config.finetune import LossConfig
from octtrain.errors import ConfigError, DataError


@dataclass(frozen=True)
class SplitSummary:
    """Volume and participant counts per split and class."""

    classes: tuple[str, ...]
    volumes: dict[str, list[int]]  # split -> count per class
    participants: dict[str, int]  # split -> participants


def check_batch_fits(items: int, batch: int, split: str, what: str, accum: int = 1) -> None:
    """Refuse one (effective) batch of ``batch * accum`` drawn from ``items`` ``what`` of
    ``split`` when they are fewer (module doc); ConfigError naming the values and the way out."""
    if items >= batch * accum:
        return
    one = f"{batch} x {accum} accumulation steps" if accum > 1 else str(batch)
    fix = (
        f"set data.batch_size to at most {items // accum}"
        if items >= accum
        else "lower the accumulation (effective_batch_size)"
    )
    raise ConfigError(
        f"data.batch_size {batch}: split {split!r} holds {items} {what} after data.select and "
        f"data.max_samples, fewer than one batch ({one}); {fix}, or train on more {what}"
    )


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
