"""The Cell Painting dataset: multi-crop on uint8 from the cache alone, only the chunks a crop
needs, channels never mixed, and the device-side views."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from octstage import manifest
from octstage.cellpainting.fieldstore import write_field
from octtrain.config.dino import CropConfig
from octtrain.data.cellpainting import (
    CellPaintingDataset,
    channel_jitter,
    field_records,
    read_region,
    read_regions,
    sample_region,
    to_views,
)
from octtrain.data.intensity import pooled
from octtrain.errors import ConfigError, DataError
from tests.octtrain.cell_cache import CellField, write_cell_cache

CROPS = CropConfig(global_size=32, local_size=16, n_local=3)


@pytest.fixture(scope="module")
def cell_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[CellField]]:
    root = tmp_path_factory.mktemp("cells")
    return root, write_cell_cache(root)


def test_regions_stay_inside_the_field_with_the_asked_area() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        y, x, h, w = sample_region(rng, 64, 80, (0.1, 0.5), (0.75, 1.333))
        assert y >= 0 and y + h <= 64 and x >= 0 and x + w <= 80
        assert 0.08 * 64 * 80 <= h * w <= 0.52 * 64 * 80


def test_a_crop_reads_only_the_chunks_it_touches(cell_cache: tuple[Path, list[CellField]]) -> None:
    root, fields = cell_cache
    ds = CellPaintingDataset(fields, root, CROPS, 4)
    array = ds.open(0)  # chunks of 32 x 32 in one shard: a 2 x 2 grid
    shard = (root / fields[0].zarr_path / "0" / "c" / "0" / "0" / "0").read_bytes()
    index = np.frombuffer(shard[-(4 * 16 + 4) : -4], dtype="<u8").reshape(4, 2)
    expected = zarr.open_array(root / fields[0].zarr_path / "0", mode="r")[...]
    for region, chunks in [((4, 4, 20, 20), [0]), ((20, 40, 20, 20), [1, 3])]:
        array.bytes_read = array.objects_read = 0
        y, x, h, w = region
        np.testing.assert_array_equal(read_region(array, region), expected[:, y : y + h, x : x + w])
        # The shard's index and the chunks the region covers (grid (0, 0), (0, 1), (1, 0), ...)
        assert array.objects_read == 1
        assert array.bytes_read == 4 * 16 + 4 + sum(int(index[c, 1]) for c in chunks)


def test_a_fields_overlapping_crops_decode_each_chunk_once(
    cell_cache: tuple[Path, list[CellField]],
) -> None:
    root, fields = cell_cache
    array = CellPaintingDataset(fields, root, CROPS, 4).open(0)  # 64 x 64, chunks 32 x 32
    shard = (root / fields[0].zarr_path / "0" / "c" / "0" / "0" / "0").read_bytes()
    index = np.frombuffer(shard[-(4 * 16 + 4) : -4], dtype="<u8").reshape(4, 2)
    expected = zarr.open_array(root / fields[0].zarr_path / "0", mode="r")[...]
    # A global crop with local crops inside it, all in chunk (0, 0): one read, chunk 0 once.
    overlapping = [(2, 2, 20, 20), (6, 8, 16, 16), (4, 4, 8, 8)]
    # Two corners: their box would cover all four chunks, the two reads only two.
    scattered = [(0, 0, 8, 8), (56, 56, 8, 8)]
    for regions, reads, chunks in ((overlapping, 1, [0]), (scattered, 2, [0, 3])):
        array.bytes_read = array.objects_read = 0
        pixels = read_regions(array, regions)
        for (y, x, h, w), got in zip(regions, pixels, strict=True):
            np.testing.assert_array_equal(got, expected[:, y : y + h, x : x + w])
        assert array.objects_read == reads
        index_bytes = reads * (4 * 16 + 4)
        assert array.bytes_read == index_bytes + sum(int(index[c, 1]) for c in chunks)


def test_items_are_uint8_multicrops_keyed_by_their_seed(
    cell_cache: tuple[Path, list[CellField]],
) -> None:
    root, fields = cell_cache
    ds = CellPaintingDataset(fields, root, CROPS, patch=4)
    item = ds[(0, 7)]
    assert item["global"].dtype == torch.uint8 and item["global"].shape == (2, 5, 32, 32)
    assert item["local"].dtype == torch.uint8 and item["local"].shape == (3, 5, 16, 16)
    for key in ("gain", "shift", "keep"):
        assert item[key].shape == (5, 5)  # 2 + 3 crops, 5 channels
    assert isinstance(item["mask_seed"], int)  # the batch's iBOT masks: test_ibot_masks.py
    again = ds[(0, 7)]
    assert all(torch.equal(item[k], again[k]) for k in ("global", "local", "gain"))
    assert item["mask_seed"] == again["mask_seed"]
    other = ds[(0, 8)]
    assert not torch.equal(item["global"], other["global"])
    centre = ds[0]
    assert centre["image"].shape == (5, 32, 32) and centre["label"] == 0


def test_augmentations_never_mix_channels(tmp_path: Path) -> None:
    # Each channel constant (10, 20, ...): any crop, resize, flip or rotation keeps it so.
    data = np.stack([np.full((48, 48), 10 * (c + 1), np.uint8) for c in range(5)])
    array = zarr.create_array(
        store=str(tmp_path / "f" / "0"), shape=data.shape, chunks=(5, 16, 16), dtype="uint8"
    )
    array[...] = data
    ds = CellPaintingDataset([CellField("f", (5, 48, 48), "train", None)], tmp_path, CROPS, 4)
    for seed in range(10):
        item = ds[(0, seed)]
        for views in (item["global"], item["local"]):
            for c in range(5):
                assert torch.all(views[:, c] == 10 * (c + 1))


def test_channel_drop_keeps_at_least_one_channel() -> None:
    rng = np.random.default_rng(0)
    cfg = CropConfig(channel_drop=0.95)
    kept = [channel_jitter(rng, 5, cfg)[2] for _ in range(200)]
    assert all(k.sum() >= 1 for k in kept)
    assert np.mean([k.sum() for k in kept]) < 1.5  # most were dropped


def test_views_apply_each_crops_channel_jitter_on_the_device_crop_major() -> None:
    b, c = 2, 3
    batch = {
        "global": torch.full((b, 2, c, 4, 4), 255, dtype=torch.uint8),
        "local": torch.zeros((b, 1, c, 2, 2), dtype=torch.uint8),
        "gain": torch.ones(b, 3, c),
        "shift": torch.zeros(b, 3, c),
        "keep": torch.ones(b, 3, c),
        "masks": torch.zeros(b, 2, 4, dtype=torch.bool),
    }
    batch["gain"][1, 1, 2] = 0.5  # field 1, global crop 1, channel 2
    batch["keep"][0, 0, 1] = 0.0  # field 0, global crop 0, channel 1 dropped
    batch["shift"][1, 2, 0] = 0.25  # field 1, the local crop, channel 0
    batch["masks"][1, 0, 3] = True
    g, loc, masks = to_views(batch)
    assert g.shape == (4, c, 4, 4) and loc.shape == (2, c, 2, 2) and masks.shape == (4, 4)
    # crop-major rows: (crop 0, field 0), (crop 0, field 1), (crop 1, field 0), (crop 1, field 1)
    assert torch.all(g[0, 1] == 0) and torch.all(g[0, 0] == 1.0)
    # The gain multiplies the intensity (x + 1 on [-1, 1]): full scale at gain 0.5 is mid-scale.
    assert torch.allclose(g[3, 2], torch.full((4, 4), 0.0)) and torch.all(g[2, 2] == 1.0)
    assert torch.allclose(loc[1, 0], torch.full((2, 2), -0.75))
    assert bool(masks[1, 3]) and int(masks.sum()) == 1


def test_views_jitter_is_in_each_channels_own_units() -> None:
    """A dark, narrow channel (mean -0.9, std 0.15 on [-1, 1], as Cell Painting's are): a 10 %
    gain leaves its black level black and moves its mean by a small share of its std, a shift of
    0.5 moves it by half a std, and a dropped channel is its mean (0 once standardised), not 0 on
    [-1, 1] (six standard deviations above a dark channel's mean)."""
    c = 2
    mean, std = torch.tensor([-0.9, -0.8]), torch.tensor([0.15, 0.5])
    image = torch.zeros((1, 2, c, 4, 4), dtype=torch.uint8)
    image[..., :2, :] = 13  # a dim quarter of the crop, the rest black background
    batch = {
        "global": image,
        "local": torch.zeros((1, 0, c, 2, 2), dtype=torch.uint8),
        "gain": torch.tensor([[[1.1, 1.0], [1.0, 1.0]]]),
        "shift": torch.tensor([[[0.0, 0.0], [0.5, 0.0]]]),
        "keep": torch.tensor([[[1.0, 0.0], [1.0, 1.0]]]),
        "masks": torch.zeros(1, 2, 4, dtype=torch.bool),
    }
    plain = to_views(
        {**batch, "gain": torch.ones(1, 2, c), "shift": torch.zeros(1, 2, c)}, (mean, std)
    )[0]
    g = to_views(batch, (mean, std))[0]
    z = lambda x: (x[0] - mean[0]) / std[0]  # noqa: E731 - channel 0 standardised
    # crop 0, channel 0, gain 1.1: black stays black, the dim part brightens by 10 % of its signal
    assert torch.allclose(g[0, 0, 2:], torch.full((2, 4), -1.0))
    moved = (z(g[0]) - z(plain[0])).mean()
    assert 0 < float(moved) < 0.1
    # crop 0, channel 1 dropped: its mean
    assert torch.allclose(g[0, 1], torch.full((4, 4), -0.8))
    # crop 1, channel 0, shift 0.5: half a standard deviation everywhere
    assert torch.allclose(z(g[1]) - z(plain[1]), torch.full((4, 4), 0.5), atol=1e-5)


def test_a_field_smaller_than_the_global_crop_is_refused(tmp_path: Path) -> None:
    small = [CellField("f", (5, 16, 16), "train", 0)]
    with pytest.raises(DataError, match=r"smaller than crops\.global_size"):
        CellPaintingDataset(small, tmp_path, CROPS, 4)


def test_a_missing_array_names_the_path_and_the_fix(tmp_path: Path) -> None:
    ds = CellPaintingDataset([CellField("gone", (5, 64, 64), "train", 0)], tmp_path, CROPS, 4)
    with pytest.raises(DataError, match="octstage verify"):
        ds[(0, 1)]


def test_a_field_whose_shard_is_gone_is_a_data_error_not_zeros(tmp_path: Path) -> None:
    fields = write_cell_cache(tmp_path, n=1)
    (tmp_path / fields[0].zarr_path / "0" / "c" / "0" / "0" / "0").unlink()
    ds = CellPaintingDataset(fields, tmp_path, CROPS, 4)
    with pytest.raises(DataError, match=r"data object c/0/0/0 is missing.*octstage verify"):
        ds[(0, 1)]
    with pytest.raises(DataError, match="is missing"):
        ds[0]


def test_a_stored_shape_other_than_the_manifests_is_a_data_error(
    cell_cache: tuple[Path, list[CellField]],
) -> None:
    root, fields = cell_cache
    c, h, w = fields[0].shape
    listed = dataclasses.replace(fields[0], shape=(c, h, w + 8))  # a rebuild at another size
    ds = CellPaintingDataset([listed], root, CROPS, 4)
    said = rf"{listed.zarr_path}: shape \({c}, {h}, {w}\) differs from the manifest's"
    for key in (0, (0, 1)):  # the deterministic item and the multi-crop one
        with pytest.raises(DataError, match=said):
            ds[key]


def test_the_columnar_manifest_gives_the_same_items_without_a_list_of_fields(
    tmp_path: Path,
) -> None:
    """Both manifest forms feed the dataset the same fields; the columnar one stays a table
    view (no list of per-field objects for loader workers to copy), and a DataLoader worker
    (a forked process) reads its items."""
    write_cell_cache(tmp_path, n=8)
    path = tmp_path / "manifest.json"
    as_json = manifest.load(path)
    manifest.write(as_json, path, form="table")
    as_table = manifest.load(path)
    train = as_table.split_fields("train")
    assert isinstance(train, manifest.ItemTable)
    ds = CellPaintingDataset(train, tmp_path, CROPS, patch=4)
    reference = CellPaintingDataset(as_json.split_fields("train"), tmp_path, CROPS, patch=4)
    assert isinstance(ds.fields, manifest.CommonRows) and len(ds) == len(reference) == 6
    assert ds.fields[4] == manifest.CommonRecord(
        **{
            k: getattr(reference.fields[4], k)
            for k in ("zarr_path", "shape", "split", "label", "intensity")
        }
    )
    assert torch.equal(ds[(3, 5)]["global"], reference[(3, 5)]["global"])
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1)
    assert [int(item["index"]) for item in loader] == list(range(6))
    assert pooled(train, 5) == pooled(list(as_json.split_fields("train")), 5)
    assert pooled(ds.fields, 5) == pooled(train, 5)


def test_a_split_s_statistics_pool_its_own_measured_rows(tmp_path: Path) -> None:
    """``CommonRows`` pick a split's rows out of the table's intensity column: with rows that
    record no statistics among them, the pooled figures are still those of the split's own
    measured rows, as of the list of its fields."""
    write_cell_cache(tmp_path, n=8)
    path = tmp_path / "manifest.json"
    m = manifest.load(path)
    unmeasured = {0, 3, 6}  # train and val rows among them
    fields = tuple(
        dataclasses.replace(f, intensity=None) if n in unmeasured else f
        for n, f in enumerate(m.fields)
    )
    m = dataclasses.replace(m, fields=fields)
    manifest.write(m, path, form="table")
    for split in ("train", "val"):
        rows = field_records(manifest.load(path).split_fields(split))
        assert isinstance(rows, manifest.CommonRows)
        assert pooled(rows, 5) == pooled(list(m.split_fields(split)), 5), split


def _overlap(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> int:
    dy = min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0])
    dx = min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1])
    return max(0, dy) * max(0, dx)


def test_global_window_keeps_the_two_global_crops_on_shared_cells(tmp_path: Path) -> None:
    """Native-scale global crops of a large field: drawn anywhere, most pairs share no pixel;
    with ``global_window`` 1.5 every pair overlaps (the second lies within 1.5 crop sides of
    the first), so the two views DINO aligns show some of the same cells."""
    crop = dict(global_size=32, local_size=16, n_local=2, scale_unit="crop")
    fields = [CellField("f", (5, 512, 512), "train", 0)]
    share = {}
    for window in (0.0, 1.5):
        ds = CellPaintingDataset(fields, tmp_path, CropConfig(**crop, global_window=window), 4)
        pairs = [ds.regions(np.random.default_rng(s), 512, 512)[:2] for s in range(300)]
        share[window] = np.mean([_overlap(a, b) > 0 for a, b in pairs])
    assert share[1.5] == 1.0
    assert share[0.0] < 0.1


def test_global_window_is_checked() -> None:
    with pytest.raises(ConfigError, match="global_window"):
        CropConfig(global_window=0.5)


ANCHORED = dict(
    global_size=32,
    local_size=16,
    n_local=1,
    scale_unit="crop",
    global_scale=(1.0, 1.0),
    local_scale=(1.0, 1.0),
    ratio=(1.0, 1.0),
    flip=0.0,
    rot90=False,
    channel_drop=0.0,
)


def test_anchor_nucleus_centres_the_first_global_crop_on_a_nucleus(tmp_path: Path) -> None:
    """``crops.anchor: nucleus``: the first global crop shows a nucleus (segmented in the DNA
    channel) at its centre; the random anchor, on the same field, mostly does not."""
    field = np.zeros((5, 128, 128), np.uint8)
    yy, xx = np.mgrid[:128, :128]
    field[0][np.hypot(yy - 90, xx - 40) < 5] = 200  # one nucleus, far from the field's centre
    write_field(tmp_path, "f", field, manifest.CELLPAINTING_CHANNELS, {})
    records = [CellField("f", (5, 128, 128), "train", 0)]

    def dna_centres(anchor: str) -> list[tuple[float, float] | None]:
        ds = CellPaintingDataset(records, tmp_path, CropConfig(**ANCHORED, anchor=anchor), 4)
        out: list[tuple[float, float] | None] = []
        for seed in range(20):
            dna = ds[(0, seed)]["global"][0, 0].numpy().astype(float)
            ys, xs = np.nonzero(dna)
            out.append((float(ys.mean()), float(xs.mean())) if len(ys) else None)
        return out

    anchored = dna_centres("nucleus")  # anchor_jitter 4 (the default)
    assert all(c is not None and max(abs(c[0] - 15.5), abs(c[1] - 15.5)) <= 4.5 for c in anchored)
    assert len({c for c in anchored}) > 1  # jittered, not one fixed crop
    randomly = dna_centres("random")
    assert sum(c is None for c in randomly) >= 10


def test_anchor_regions_are_centred_within_the_jitter_and_inside_the_field() -> None:
    ds = CellPaintingDataset([], ".", CropConfig(**ANCHORED, anchor="nucleus", anchor_jitter=3), 4)
    centres = np.array([[2.0, 60.0], [40.0, 125.0], [70.0, 70.0]])
    seen = set()
    for seed in range(200):
        y, x, h, w = ds.regions(np.random.default_rng(seed), 128, 128, centres)[0]
        assert 0 <= y <= 128 - h and 0 <= x <= 128 - w
        # The nearest nucleus to the crop's centre, once the crop was moved inside the field.
        cy, cx = y + (h - 1) / 2, x + (w - 1) / 2
        ny, nx = min(centres, key=lambda c: np.hypot(c[0] - cy, c[1] - cx))
        seen.add((ny, nx))
        assert abs(np.clip(ny - (h - 1) / 2, 0, 128 - h) - y) <= 3.5
        assert abs(np.clip(nx - (w - 1) / 2, 0, 128 - w) - x) <= 3.5
    assert len(seen) == 3  # every nucleus drawn
    # No nucleus found: the random region, as without the anchor.
    empty = np.zeros((0, 2))
    for seed in range(5):
        plain = ds.regions(np.random.default_rng(seed), 128, 128)
        assert ds.regions(np.random.default_rng(seed), 128, 128, empty) == plain


def test_anchor_is_checked() -> None:
    with pytest.raises(ConfigError, match="anchor must be one of"):
        CropConfig(anchor="cell")
    with pytest.raises(ConfigError, match="anchor_jitter"):
        CropConfig(anchor_jitter=-1)
