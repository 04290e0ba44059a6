"""The lesion twin's data for ``bench_label_efficiency.py``: the run's budget (sizes, steps and
the chosen options), the Zarr cache with its four devices and the unseen fifth, the nested
class-stratified label subsets, and the sub-manifests the fine-tuning runs read."""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from device_looks import DEVICE_LOOK, UNSEEN, render, unseen_look

from octstage import manifest as mf
from octstage.dataset.ids import DEVICES
from octstage.dataset.labels import STUDY_GROUPS
from octstage.dataset.synth_lesions import NUM_CLASSES
from tests.octtrain.tiny_cache import cached_volume, write_synthetic_manifest

FRACTIONS = (0.01, 0.10, 0.25, 1.0)
SITE_DIGITS = ("1", "4", "7")


@dataclass(frozen=True)
class Budget:
    shape: tuple[int, int, int]
    patch: tuple[int, int, int]
    counts: dict[str, int]  # participants (= volumes) per class and split
    pretrain_steps: int
    finetune_steps: int  # optimizer steps per fine-tuning run (batch 32) ...
    max_epochs: int  # ... but at most this many epochs (1%, 10% and 25% stop here)
    validations: int  # per fine-tuning run
    probe_epochs: int
    probe_lrs: tuple[float, ...]
    bootstrap: int
    fractions: tuple[float, ...] = FRACTIONS
    recipe: str = "plain"  # a key of RECIPES: the fine-tuning recipe of both arms
    acquisition: bool = False  # pretraining views with ACQUISITION's looks
    two_looks: bool = False  # ... and the target encoder with another intensity look


def budget(args: argparse.Namespace) -> Budget:
    if args.quick:
        counts = {"train": 32, "val": 6, "test": 8}
        return Budget(
            (16, 32, 32), (4, 8, 8), counts, 60, 12, 12, 3, 8, (1e-3,), 200,
            args.fractions, args.recipe, args.acquisition, args.two_looks,
        )  # fmt: skip
    counts = {"train": args.train or 256, "val": 16, "test": 32}
    # From random init the tiny ViT needs ~2000 steps to leave chance with 1024 labels
    # (test balanced accuracy, seed 0: 320 steps 0.27, 1280 steps 0.38, 2400 steps 0.57); the
    # epoch cap keeps the small subsets from spending that on a few volumes (100%: 2016 steps,
    # 25%: 800, 10%: 300, 1%: 100) and the fine-tuning near 20 minutes on 2 busy cores.
    steps = args.finetune_steps or 2000
    # Pretraining: the frozen encoder's lesions grow with its steps (bench_lesion_tokens.py,
    # token lesion AUROC, data seed 0, random init 0.740): 3000 steps 0.767, 12,000 0.837,
    # 20,000 0.875, 30,000 0.877. At 3000 (the earlier default) the encoder had barely started
    # to carry the label. 30,000 steps of batch 8 are ~230 epochs of the 1024 volumes (491 s
    # on one thread in the final run).
    return Budget(
        (16, 32, 32),
        (4, 8, 8),
        counts,
        args.steps or 30000,
        steps,
        100,
        10,
        40,
        (3e-4, 1e-3, 3e-3),
        1000,
        args.fractions,
        args.recipe,
        args.acquisition,
        args.two_looks,
    )


def write_cache(root: Path, b: Budget, seed: int) -> Path:
    """Real Zarr cache + manifest; participants cycle through devices and sites."""
    cache = root / "cache"
    rng = np.random.default_rng([seed, 18])
    volumes = []
    serial = 0

    def add(pid: str, array: np.ndarray, split: str, label: int, group: str, device: str) -> None:
        nonlocal serial
        serial += 1
        volumes.append(
            cached_volume(
                cache,
                pid,
                f"k{serial:05d}",
                array,
                split=split,
                label=label,
                group=group,
                device=device,
                laterality="LR"[serial % 2],
                protocol="synthetic-lesions",
            )
        )

    for split, per_class in b.counts.items():
        for i in range(per_class):
            for label, group in enumerate(STUDY_GROUPS[:NUM_CLASSES]):
                device = DEVICES[(i + label) % len(DEVICES)]
                pid = f"{SITE_DIGITS[serial % 3]}{serial // 3:03d}"
                add(
                    pid,
                    render(b.shape, label, DEVICE_LOOK[device], rng),
                    split,
                    label,
                    group,
                    device,
                )
    # The unseen device's test volumes: as many per class as the test split, from their own
    # generator (drawn after the others, which stay what they were without them).
    unseen, urng = unseen_look(seed), np.random.default_rng([seed, 26, 1])
    for i in range(b.counts["test"]):
        for label, group in enumerate(STUDY_GROUPS[:NUM_CLASSES]):
            add(
                f"9{i:03d}{label}",
                render(b.shape, label, unseen, urng),
                UNSEEN,
                label,
                group,
                UNSEEN,
            )
    config = {"shape": list(b.shape), "seed": seed, "device_look": device_looks_record(seed)}
    classes = STUDY_GROUPS[:NUM_CLASSES]
    path = write_synthetic_manifest(cache, volumes, classes, "bench-label-efficiency", config)
    return path


def device_looks_record(seed: int) -> dict[str, Any]:
    return {d: asdict(look) for d, look in {**DEVICE_LOOK, UNSEEN: unseen_look(seed)}.items()}


def subsets(
    train: Sequence[mf.Volume], fractions: Sequence[float], seed: int
) -> dict[float, list[str]]:
    """Nested, class-stratified participant subsets: per class ``max(1, round(f * n))``
    participants, a prefix of one seeded permutation of that class's participants."""
    rng = np.random.default_rng([seed, 1])
    by_class: dict[int, list[str]] = defaultdict(list)
    for v in train:
        if v.participant_id not in by_class[v.label]:
            by_class[v.label].append(v.participant_id)
    orders = {c: [ids[i] for i in rng.permutation(len(ids))] for c, ids in sorted(by_class.items())}
    return {
        f: sorted(p for ids in orders.values() for p in ids[: max(1, round(f * len(ids)))])
        for f in fractions
    }


def sub_manifest(
    man: mf.Manifest, path: Path, keep_train: set[str], exclude_device: str | None = None
) -> Path:
    """The manifest with only ``keep_train``'s training participants (val and test whole)."""
    volumes = tuple(
        v
        for v in man.volumes
        if (v.split != "train" or v.participant_id in keep_train)
        and (exclude_device is None or v.split in ("test", UNSEEN) or v.device != exclude_device)
    )
    mf.write(replace(man, volumes=volumes), path)
    return path
