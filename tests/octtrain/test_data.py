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
from octtrain.config.pretrain import MaskConfig
from octtrain.config.sections import AugmentConfig, DataConfig
from octtrain.data import samplers
from octtrain.data.dataset import ManifestDataset, Transform, to_model_input
from octtrain.data.loaders import Prefetcher, padded_loader, train_loader
from octtrain.data.masks import SampleMasker
from octtrain.data.samplers import EpochSampler, shard
from octtrain.errors import DataError

Cache = tuple[Path, Path]


def test_items_are_uint8_with_labels_and_scale_on_the_device(tiny_cache: Cache) -> None:
    manifest_path, cache = tiny_cache
    manifest = load(manifest_path)
    ds = ManifestDataset(manifest, cache, "train")
    assert len(ds) == len(manifest.split("train")) == 32
    item = ds[3]
    # uint8 crosses the worker pipe and the host-to-device link: a quarter of float32's bytes
    assert item["image"].shape == (1, 8, 32, 32) and item["image"].dtype == torch.uint8
    assert float(item["gain"]) == 1.0 and float(item["shift"]) == 0.0
    x = to_model_input({k: v[None] for k, v in item.items() if isinstance(v, torch.Tensor)})
    assert x.dtype == torch.float32 and -1 - 1e-6 <= float(x.min()) <= float(x.max()) <= 1 + 1e-6
    v = manifest.split("train")[3]
    assert (item["label"], item["participant_id"], item["index"]) == (v.label, v.participant_id, 3)


def test_device_scaling_matches_the_float_pipeline_it_replaced(tiny_cache: Cache) -> None:
    manifest_path, cache = tiny_cache
    aug = AugmentConfig(flip_w=0.5, brightness=0.2, contrast=0.2)
    ds = ManifestDataset(load(manifest_path), cache, "train", Transform((8, 24, 24), aug))
    batch = torch.utils.data.default_collate([ds[(i, 100 + i)] for i in range(6)])
    new = to_model_input(batch)
    # The old workers computed (v * 2/255 - 1) * gain + shift in float32 numpy, per sample.
    for i in range(6):
        rng = np.random.default_rng(100 + i)
        crop = ds.transform(ds.read(i), rng)[0].astype(np.float32)  # type: ignore[misc]
        gain, shift = float(batch["gain"][i]), float(batch["shift"][i])
        old = crop * np.float32(2.0 / 255.0 * gain) + np.float32(shift - gain)
        np.testing.assert_allclose(new[i, 0].numpy(), old, rtol=1e-6, atol=1e-6)


def test_augmentation_is_keyed_by_seed(tiny_cache: Cache) -> None:
    manifest_path, cache = tiny_cache
    transform = Transform((8, 24, 24), AugmentConfig(flip_w=0.5, brightness=0.2, contrast=0.2))
    ds = ManifestDataset(load(manifest_path), cache, "train", transform)
    a, b, c = ds[(0, 1)], ds[(0, 1)], ds[(0, 2)]
    assert a["image"].shape == (1, 8, 24, 24)
    assert torch.equal(a["image"], b["image"]) and float(a["gain"]) == float(b["gain"])
    assert (float(a["gain"]), float(a["shift"])) != (float(c["gain"]), float(c["shift"]))
    plain = ds[0]["image"]  # no seed: centre crop, no jitter
    assert torch.equal(plain, ds[0]["image"])


def test_masks_come_with_the_item_as_int32_keyed_by_its_seed(tiny_cache: Cache) -> None:
    manifest_path, cache = tiny_cache
    masker = SampleMasker((2, 4, 4), MaskConfig(ratio=0.5))
    ds = ManifestDataset(load(manifest_path), cache, "train", masker=masker)
    a, b, c = ds[(0, 1)], ds[(0, 1)], ds[(0, 2)]
    assert a["context_idx"].dtype == torch.int32 and a["target_idx"].shape == (16,)
    assert torch.equal(a["target_idx"], b["target_idx"])
    assert not torch.equal(a["target_idx"], c["target_idx"])
    both = torch.cat([a["context_idx"], a["target_idx"]]).sort().values
    assert both.tolist() == list(range(32))
    # Deterministic items (validation) have fixed masks: the same at every validation.
    assert torch.equal(ds[5]["target_idx"], ds[5]["target_idx"])


def test_crop_larger_than_volume_is_a_data_error() -> None:
    with pytest.raises(DataError, match="smaller than crop"):
        Transform((8, 64, 64), None)(np.zeros((8, 32, 32), np.uint8), None)


def test_train_shards_are_disjoint_per_epoch_and_resume_continues_the_stream() -> None:
    a = EpochSampler(10, 0, 2, seed=3)
    b = EpochSampler(10, 1, 2, seed=3)
    ia, ib = iter(a), iter(b)
    first_a = [next(ia) for _ in range(5)]
    first_b = [next(ib) for _ in range(5)]
    assert not {i for i, _ in first_a} & {i for i, _ in first_b}
    assert {i for i, _ in first_a} | {i for i, _ in first_b} == set(range(10))
    stream = [next(ia) for _ in range(7)]
    resumed = iter(EpochSampler(10, 0, 2, seed=3, start=5))
    assert [next(resumed) for _ in range(7)] == stream
    assert len({s for _, s in first_a + first_b}) == 10  # every item of an epoch: its own seed


def test_the_sampler_draws_each_seed_when_its_item_is_drawn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A million-field epoch drew every seed (~10 s) before its first batch. The stream is
    # unchanged (the same pairs as epoch_items, resumed or not); only the first items' seeds
    # are drawn for the first items.
    drawn: list[int] = []
    seed_of = samplers.item_seed

    def counted(seed: int, epoch: int, position: int) -> int:
        drawn.append(position)
        return seed_of(seed, epoch, position)

    sampler = EpochSampler(100_000, 1, 2, seed=7, start=3)
    expected = EpochSampler(100_000, 1, 2, seed=7).epoch_items(0)[3:6]
    monkeypatch.setattr(samplers, "item_seed", counted)
    stream = iter(sampler)
    assert [next(stream) for _ in range(3)] == expected
    assert len(drawn) == 3


@pytest.mark.parametrize("hosts", [2, 4])
def test_global_batch_and_its_masks_are_the_same_whatever_the_number_of_hosts(
    tiny_cache: Cache, hosts: int
) -> None:
    # A pod simulated: each host's sampler and workers, the shards put together, against one
    # host loading the same global batch. Same samples, same seeds, same masks (sample by
    # sample), so the hosts agree on the global batch without communicating.
    manifest_path, cache = tiny_cache
    masker = SampleMasker((2, 4, 4), MaskConfig(ratio=0.5))
    aug = AugmentConfig()
    ds = ManifestDataset(
        load(manifest_path), cache, "train", Transform((8, 32, 32), aug), None, masker
    )
    global_batch, cfg = 8, DataConfig(num_workers=0)

    def by_index(batch: dict[str, Any]) -> dict[int, tuple[Any, ...]]:
        return {
            int(i): (tuple(t.tolist()), float(g), float(s), img.sum().item())
            for i, t, g, s, img in zip(
                batch["index"],
                batch["target_idx"],
                batch["gain"],
                batch["shift"],
                batch["image"],
                strict=True,
            )
        }

    one = iter(train_loader(ds, cfg, global_batch, 0, 1, seed=7))
    pod = [
        iter(train_loader(ds, cfg, global_batch // hosts, h, hosts, seed=7)) for h in range(hosts)
    ]
    for _ in range(6):  # past an epoch boundary (32 volumes / 8)
        single = by_index(next(one))
        assembled: dict[int, tuple[Any, ...]] = {}
        for host in pod:
            part = by_index(next(host))
            assert not part.keys() & assembled.keys()  # hosts never load the same sample
            assembled |= part
        assert assembled == single


def test_validation_shards_cover_the_split_once() -> None:
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


def test_padded_validation_shards_run_equal_batches_with_fillers(tiny_cache: Cache) -> None:
    manifest_path, cache = tiny_cache
    ds = ManifestDataset(load(manifest_path), cache, "val")
    loaders = [padded_loader(ds, 5, r, 2, 2) for r in range(2)]
    batches = [list(loader) for loader in loaders]
    assert [len(b) for b in batches] == [2, 2]  # ceil(ceil(5 / 2) / 2): the same everywhere
    valid = [[b["valid"].tolist() for b in rank] for rank in batches]
    assert valid == [[[1.0, 1.0], [1.0, 0.0]], [[1.0, 1.0], [0.0, 0.0]]]
    real = [
        int(i)
        for rank in batches
        for b in rank
        for i, v in zip(b["index"], b["valid"], strict=True)
        if v
    ]
    assert sorted(real) == list(range(5))


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
    direct = [b["index"].tolist() for b in padded_loader(ds, len(ds), 0, 1, 3)]
    prefetched = Prefetcher(padded_loader(ds, len(ds), 0, 1, 3, DataConfig(num_workers=2)))
    assert [b["index"].tolist() for b in prefetched] == direct
    prefetched.close()

    broken = ManifestDataset(load(manifest_path), cache / "elsewhere", "val")
    failing = Prefetcher(padded_loader(broken, len(broken), 0, 1, 3))
    with pytest.raises(DataError, match="not in the cache"):
        next(failing)
    failing.close()


def test_repeat_draws_of_one_sample_get_their_own_masks_and_hosts_agree(
    tiny_cache: Cache,
) -> None:
    # Balanced sampling draws with replacement: sample 0, nearly certain, comes many times per
    # epoch. Its seed (so its crop and its mask) is keyed by the draw's global position, never by
    # the sample's index, so no two draws share a mask; and two hosts' shards, put together, are
    # the single host's stream.
    p = np.array([0.97, 0.01, 0.01, 0.01])
    one = EpochSampler(4, 0, 1, seed=5, per_epoch=8, probabilities=p).epoch_items(0)
    hosts = [
        EpochSampler(4, h, 2, seed=5, per_epoch=4, probabilities=p).epoch_items(0) for h in (0, 1)
    ]
    assert [item for pair in zip(*hosts, strict=True) for item in pair] == one
    repeats = [s for i, s in one if i == 0]
    assert len(repeats) >= 3 and len(set(repeats)) == len(repeats)
    masker = SampleMasker((2, 4, 4), MaskConfig(ratio=0.5))
    ds = ManifestDataset(
        load(tiny_cache[0]),
        tiny_cache[1],
        "train",
        Transform((8, 32, 32), AugmentConfig()),
        None,
        masker,
    )
    masks = {tuple(ds[(0, s)]["target_idx"].tolist()) for s in repeats}
    assert len(masks) > 1  # (block masks on a tiny grid can coincide by chance; all never)
