"""The manifest-fed dataset and its samplers: items, augmentation, sharding, resume, I/O audit."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from octstage.manifest import load
from octtrain.config import AugmentConfig, DataConfig
from octtrain.data import (
    ManifestDataset,
    Prefetcher,
    TrainSampler,
    Transform,
    eval_loader,
    pad_batch,
    shard,
    train_loader,
)
from octtrain.errors import DataError

Cache = tuple[Path, Path]


def test_items_are_scaled_tensors_with_labels(tiny_cache: Cache) -> None:
    manifest_path, cache = tiny_cache
    manifest = load(manifest_path)
    ds = ManifestDataset(manifest, cache, "train")
    assert len(ds) == len(manifest.split("train")) == 32
    item = ds[3]
    assert item["image"].shape == (1, 8, 32, 32) and item["image"].dtype == torch.float32
    assert float(item["image"].min()) >= -1.0 and float(item["image"].max()) <= 1.0
    v = manifest.split("train")[3]
    assert (item["label"], item["participant_id"], item["index"]) == (v.label, v.participant_id, 3)


def test_augmentation_is_keyed_by_seed(tiny_cache: Cache) -> None:
    manifest_path, cache = tiny_cache
    transform = Transform((8, 24, 24), AugmentConfig(flip_w=0.5, brightness=0.2, contrast=0.2))
    ds = ManifestDataset(load(manifest_path), cache, "train", transform)
    a, b, c = ds[(0, 1)]["image"], ds[(0, 1)]["image"], ds[(0, 2)]["image"]
    assert a.shape == (1, 8, 24, 24)
    assert torch.equal(a, b) and not torch.equal(a, c)
    plain = ds[0]["image"]  # no seed: centre crop, no jitter
    assert torch.equal(plain, ds[0]["image"])


def test_crop_larger_than_volume_is_a_data_error() -> None:
    with pytest.raises(DataError, match="smaller than crop"):
        Transform((8, 64, 64), None)(np.zeros((8, 32, 32), np.uint8), None)


def test_train_shards_are_disjoint_per_epoch_and_resume_continues_the_stream() -> None:
    a = TrainSampler(10, 0, 2, seed=3)
    b = TrainSampler(10, 1, 2, seed=3)
    ia, ib = iter(a), iter(b)
    first_a = [next(ia) for _ in range(5)]
    first_b = [next(ib) for _ in range(5)]
    assert not {i for i, _ in first_a} & {i for i, _ in first_b}
    assert {i for i, _ in first_a} | {i for i, _ in first_b} == set(range(10))
    stream = [next(ia) for _ in range(7)]
    resumed = iter(TrainSampler(10, 0, 2, seed=3, start=5))
    assert [next(resumed) for _ in range(7)] == stream
    assert len({s for _, s in first_a + stream}) == 12  # every item gets its own seed


def test_eval_shards_cover_the_split_once() -> None:
    parts = [shard(11, r, 3) for r in range(3)]
    assert sorted(i for part in parts for i in part) == list(range(11))


def test_train_loader_batches_are_reproducible_with_workers(tiny_cache: Cache) -> None:
    manifest_path, cache = tiny_cache
    ds = ManifestDataset(
        load(manifest_path), cache, "train", Transform((8, 32, 32), AugmentConfig())
    )
    cfg = DataConfig(num_workers=2, persistent_workers=True)
    run1 = iter(train_loader(ds, cfg, 4, 0, 1, seed=0))
    batches = [next(run1) for _ in range(3)]
    resumed = iter(train_loader(ds, DataConfig(num_workers=0), 4, 0, 1, seed=0, start_step=2))
    third = next(resumed)
    assert torch.equal(third["image"], batches[2]["image"])
    assert third["index"].tolist() == batches[2]["index"].tolist()


def test_eval_loader_and_padding(tiny_cache: Cache) -> None:
    manifest_path, cache = tiny_cache
    ds = ManifestDataset(load(manifest_path), cache, "val")
    batches = list(eval_loader(ds, DataConfig(num_workers=0), 3, 0, 1))
    assert [len(b["index"]) for b in batches] == [3, 3, 2]
    padded = pad_batch(batches[-1], 3)
    assert padded["image"].shape[0] == 3 and padded["valid"].tolist() == [1.0, 1.0, 0.0]
    assert len(padded["participant_id"]) == 3


class _Audit:
    """Records file opens, directory listings and socket use while ``active``."""

    def __init__(self) -> None:
        self.active = False
        self.opened: list[str] = []
        self.listed: list[str] = []
        self.sockets: list[str] = []

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active:
            return
        if event == "open" and isinstance(args[0], str | bytes | os.PathLike):
            self.opened.append(os.fsdecode(args[0]))
        elif event in ("os.listdir", "os.scandir", "os.walk", "glob.glob"):
            self.listed.append(f"{event} {args[0]!r}")
        elif event.startswith("socket."):
            self.sockets.append(event)


@pytest.fixture(scope="module")
def audit() -> Iterator[_Audit]:
    hook = _Audit()
    sys.addaudithook(hook)  # cannot be removed: it stays inert once ``active`` is False
    yield hook
    hook.active = False


def test_dataset_opens_only_listed_paths_never_lists_or_calls_out(
    tiny_cache: Cache, audit: _Audit
) -> None:
    manifest_path, cache = tiny_cache
    audit.active = True
    try:
        manifest = load(manifest_path)
        ds = ManifestDataset(manifest, cache, "val", Transform((8, 32, 32), AugmentConfig()))
        items = [ds[(i, i)] for i in range(len(ds))]
    finally:
        audit.active = False
    assert len(items) == 8
    assert audit.listed == [] and audit.sockets == []
    allowed = [str(manifest_path)] + [str(cache / v.array_path) for v in manifest.split("val")]
    data_files = [p for p in audit.opened if not p.endswith(".py") and "site-packages" not in p]
    assert data_files, "the audit hook saw no opens"
    for path in data_files:
        assert any(path == a or path.startswith(a + "/") for a in allowed), path
    for v in manifest.split("val"):
        assert any(p.startswith(str(cache / v.array_path) + "/") for p in data_files)


def test_prefetcher_yields_every_batch_in_order_and_reraises_loader_errors(
    tiny_cache: Cache,
) -> None:
    manifest_path, cache = tiny_cache
    ds = ManifestDataset(load(manifest_path), cache, "val")
    direct = [b["index"].tolist() for b in eval_loader(ds, DataConfig(num_workers=0), 3, 0, 1)]
    prefetched = Prefetcher(eval_loader(ds, DataConfig(num_workers=2), 3, 0, 1))
    assert [b["index"].tolist() for b in prefetched] == direct
    prefetched.close()

    broken = ManifestDataset(load(manifest_path), cache / "elsewhere", "val")
    failing = Prefetcher(eval_loader(broken, DataConfig(num_workers=0), 3, 0, 1))
    with pytest.raises(DataError, match="cannot read cached volume"):
        next(failing)
    failing.close()
