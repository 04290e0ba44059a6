"""Cell Painting fields for DINOv2: multi-crop views read from the cache alone.

``CellPaintingDataset`` takes the manifest's field records (``octstage.manifest``: ``zarr_path``
with the uint8 ``[C, Y, X]`` array at ``zarr_path/0``, ``shape``, ``split``, ``label``) and a
cache root; it never lists a folder. A training item (``dataset[(index, seed)]``) is DINOv2's
multi-crop of one field: 2 global and ``n_local`` local crops, random regions read through
``data/arrayread.py`` (only the chunks the regions touch are read, each decoded once; a missing
data object is a DataError, never zeros), resized, flipped and rotated by multiples of 90
degrees, all on **uint8** in the loader worker; with ``crops.anchor: nucleus`` the first global
crop is centred on one of the field's nuclei (``data/nuclei.py``). The channel-aware intensity
jitter (a gain and a shift per channel) and channel drop travel as small float
tensors; ``to_views`` applies them with the scaling to [-1, 1] on the device, inside the step,
so a batch crosses the worker pipe and the host-to-device link at a quarter of float32's bytes.
Channels are never mixed (no colour jitter: a Cell Painting channel is a stain, not a colour).
Crop sizes are fractions of the field (``crops.scale_unit: field``, DINOv2) or of the output
crop (``crop``: 1.0 reads native pixels, the scale ``octtrain profile`` tiles at); local crops
fall inside a global crop (``crops.local_in_global``). The batch's iBOT block masks are drawn by
the loader's ``collate_fn`` (``data/ibot_masks.py``), seeded from each item's ``mask_seed``.

A deterministic item (``dataset[index]``) is the centre crop of ``global_size`` (evaluation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from octstage.manifest import CommonRows, ItemTable
from octtrain.config.dino import CropConfig
from octtrain.config.sections import DataConfig
from octtrain.data.arrayread import CachedArray, PackedItem, open_array, open_item
from octtrain.data.ibot_masks import IbotCollate
from octtrain.data.loaders import loader_kwargs
from octtrain.data.nuclei import crop_start, nucleus_centres, segment_nuclei
from octtrain.data.samplers import EpochSampler
from octtrain.errors import DataError

Region = tuple[int, int, int, int]  # y, x, height, width


class FieldRecord(Protocol):
    """What the dataset reads of a manifest field (octstage.manifest's common part)."""

    @property
    def zarr_path(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def label(self) -> int | None: ...
    @property
    def split(self) -> str: ...


def field_records(fields: Sequence[FieldRecord]) -> Sequence[FieldRecord]:
    """What the dataset keeps of its fields: of the columnar manifest (an ``ItemTable``), the
    common part as arrays (``CommonRows``: no Python object per field for loader workers to
    copy on write); any other sequence as it is."""
    return fields.common() if isinstance(fields, ItemTable) else fields


def field_shapes(fields: Sequence[FieldRecord]) -> np.ndarray:
    """Every field's ``[C, Y, X]``, in order, as an ``[n, 3]`` array (of ``CommonRows``: its
    own array, no record built)."""
    if isinstance(fields, CommonRows):
        return fields.shapes
    return np.array([tuple(f.shape) for f in field_records(fields)], dtype=np.int64).reshape(-1, 3)


def field_channels(fields: Sequence[Any]) -> tuple[str, ...] | None:
    """The first field's channel names, without building a field of the columnar manifest (an
    item built there reads every column of the table: GBs at a million fields); None when the
    records carry no names."""
    if not len(fields):
        return None
    if isinstance(fields, ItemTable):
        names = fields[:1].column_array("channels", keep=False)[0].as_py()
    else:
        names = getattr(fields[0], "channels", None)
    return tuple(str(n) for n in names) if names else None


def _shape(
    rng: np.random.Generator,
    height: int,
    width: int,
    area: tuple[float, float],
    ratio: tuple[float, float],
) -> tuple[int, int] | None:
    """A region's ``(h, w)``: area in ``area`` pixels, aspect ``ratio`` (h/w), fitting the
    field (torchvision's RandomResizedCrop sampling; None after 10 misses)."""
    for _ in range(10):
        target = rng.uniform(*area)
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        h = round(math.sqrt(target * aspect))
        w = round(math.sqrt(target / aspect))
        if 0 < h <= height and 0 < w <= width:
            return h, w
    return None


def sample_region(
    rng: np.random.Generator,
    height: int,
    width: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    unit: float | None = None,
) -> Region:
    """A random region of ``scale`` x ``unit`` pixels (None: the field's area) and aspect
    ``ratio`` (h/w), inside the field (after 10 misses, the largest centred square)."""
    unit = float(height * width) if unit is None else unit
    shape = _shape(rng, height, width, (scale[0] * unit, scale[1] * unit), ratio)
    if shape is None:
        side = min(height, width)
        return (height - side) // 2, (width - side) // 2, side, side
    h, w = shape
    return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w


def _place(rng: np.random.Generator, start: int, outer: int, size: int, limit: int) -> int:
    """One axis of a region of ``size`` inside ``[start, start + outer)`` when it fits, else
    centred on it, kept inside ``[0, limit)``."""
    if size <= outer:
        return start + int(rng.integers(0, outer - size + 1))
    return min(max(0, start - (size - outer) // 2), limit - size)


def sample_region_in(
    rng: np.random.Generator,
    outer: Region,
    height: int,
    width: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    unit: float | None = None,
) -> Region:
    """``sample_region``'s region, placed inside ``outer`` (centred on it along an axis where it
    is larger): a local crop that sees part of its global crop, as DINO's local-to-global
    correspondence assumes."""
    unit = float(height * width) if unit is None else unit
    shape = _shape(rng, height, width, (scale[0] * unit, scale[1] * unit), ratio)
    oy, ox, oh, ow = outer
    h, w = shape if shape is not None else (oh, ow)
    return _place(rng, oy, oh, h, height), _place(rng, ox, ow, w, width), h, w


def centred_on(
    region: Region,
    centre: tuple[float, float],
    jitter: int,
    rng: np.random.Generator,
    height: int,
    width: int,
) -> Region:
    """``region``'s size placed with its centre on ``centre`` (y, x) moved by up to ``jitter``
    pixels per axis, kept inside the field (``crop_start``, the rule ``embed``'s single-cell
    views are placed by)."""
    _, _, h, w = region
    dy, dx = (int(d) for d in rng.integers(-jitter, jitter + 1, size=2))
    return int(crop_start(centre[0], h, height, dy)), int(crop_start(centre[1], w, width, dx)), h, w


def around(region: Region, factor: float, height: int, width: int) -> Region:
    """``region`` grown ``factor`` times per side about its centre, kept inside the field."""
    y, x, h, w = region
    gh, gw = min(height, round(h * factor)), min(width, round(w * factor))
    gy = min(max(0, y + h // 2 - gh // 2), height - gh)
    gx = min(max(0, x + w // 2 - gw // 2), width - gw)
    return gy, gx, gh, gw


def read_region(array: CachedArray | PackedItem, region: Region) -> np.ndarray:
    """``array[:, y:y+h, x:x+w]`` as uint8, reading only the chunks the region touches."""
    y, x, h, w = region
    return array.read((slice(None), slice(y, y + h), slice(x, x + w)))


def chunks_covered(region: Region, tile: Sequence[int]) -> int:
    """How many chunks of ``tile`` (height, width) pixels a read of ``region`` decodes, per
    channel."""
    y, x, h, w = region
    th, tw = tile
    return ((y + h - 1) // th - y // th + 1) * ((x + w - 1) // tw - x // tw + 1)


def read_regions(array: CachedArray | PackedItem, regions: Sequence[Region]) -> list[np.ndarray]:
    """Each region's pixels (``read_region``'s, as views). A field's crops overlap (local crops
    inside the global ones, the two globals in one window): when their bounding box covers no
    more chunks than the regions do one by one, the box is read once and cut, so each chunk is
    decoded once instead of once per crop (the twin's items, 64 px chunks: 2x faster)."""
    top, left = min(r[0] for r in regions), min(r[1] for r in regions)
    bottom, right = max(r[0] + r[2] for r in regions), max(r[1] + r[3] for r in regions)
    box, tile = (top, left, bottom - top, right - left), array.tile
    if chunks_covered(box, tile) > sum(chunks_covered(r, tile) for r in regions):
        return [read_region(array, r) for r in regions]
    pixels = read_region(array, box)
    return [pixels[:, y - top : y - top + h, x - left : x - left + w] for y, x, h, w in regions]


def resize(crop: np.ndarray, size: int) -> np.ndarray:
    """uint8 ``[C, h, w]`` -> uint8 ``[C, size, size]`` (bilinear, antialiased when shrinking)."""
    if crop.shape[1:] == (size, size):
        return crop
    t = torch.from_numpy(np.ascontiguousarray(crop)).float()[None]
    out = F.interpolate(t, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return out[0].round().clamp(0, 255).to(torch.uint8).numpy()


def flip_rotate(crop: np.ndarray, rng: np.random.Generator, flip: float, rot90: bool) -> np.ndarray:
    """Horizontal flip with probability ``flip``, then 0-3 quarter turns (square crops)."""
    if rng.random() < flip:
        crop = crop[:, :, ::-1]
    if rot90:
        crop = np.rot90(crop, k=int(rng.integers(4)), axes=(1, 2))
    return np.ascontiguousarray(crop)


def channel_jitter(
    rng: np.random.Generator, channels: int, cfg: CropConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-channel ``gain``, ``shift`` and ``keep`` (0: dropped; at least one channel kept)."""
    gain = 1.0 + rng.uniform(-cfg.contrast, cfg.contrast, channels)
    shift = rng.uniform(-cfg.brightness, cfg.brightness, channels)
    keep = (rng.random(channels) >= cfg.channel_drop).astype(np.float32)
    if not keep.any():
        keep[rng.integers(channels)] = 1.0
    return gain.astype(np.float32), shift.astype(np.float32), keep


class CellPaintingDataset(Dataset[dict[str, Any]]):
    """The fields of one split, multi-cropped for DINOv2 (see the module docstring).

    Items: ``global`` uint8 ``[2, C, G, G]``, ``local`` uint8 ``[L, C, l, l]``, ``gain``,
    ``shift``, ``keep`` float32 ``[2 + L, C]``, ``mask_seed`` int, ``label`` int (-1: none),
    ``index`` (collated: plus ``masks [B, 2, N]``, ``mask_index``, ``mask_weight``);
    deterministic items: ``image`` uint8 ``[C, G, G]``, ``label``, ``index``.
    """

    def __init__(
        self,
        fields: Sequence[FieldRecord],
        cache_root: str | Path,
        crops: CropConfig,
        patch: int,
        mask_probability: float = 0.5,
        mask_ratio: tuple[float, float] = (0.1, 0.5),
        max_samples: int | None = None,
    ) -> None:
        # A slice, not a list: the columnar manifest's fields stay arrays (CommonRows) that
        # loader workers share; ``self.fields[i]`` builds one record when read.
        self.fields = field_records(fields)[:max_samples]
        self.cache_root = Path(cache_root)
        self.crops, self.patch = crops, patch
        self.mask_probability, self.mask_ratio = mask_probability, mask_ratio
        shapes = field_shapes(self.fields)
        small = np.flatnonzero(shapes[:, 1:].min(axis=1, initial=1 << 62) < crops.global_size)
        if len(small):
            _, h, w = shapes[small[0]]
            raise DataError(
                f"{self.fields[int(small[0])].zarr_path}: field {h}x{w} is smaller than "
                f"crops.global_size {crops.global_size}"
            )

    def __len__(self) -> int:
        return len(self.fields)

    def open(self, index: int) -> CachedArray | PackedItem:
        """The field's array, or its place in a pack (metadata only; chunks are read by
        ``read``)."""
        f = self.fields[index]
        path = self.cache_root / f.zarr_path / "0"
        slot = getattr(f, "pack_index", None)  # None: the array is the field alone
        if slot is None:
            return open_array(path, f"field {f.zarr_path} at {path}")
        return open_item(path, f"field {f.zarr_path} [{slot}] at {path}", slot, f.shape)

    def _crop(self, pixels: np.ndarray, rng: np.random.Generator, size: int) -> np.ndarray:
        return flip_rotate(resize(pixels, size), rng, self.crops.flip, self.crops.rot90)

    def nuclei(self, array: CachedArray | PackedItem) -> np.ndarray:
        """``[N, 2]``: the (y, x) centres of the field's nuclei, segmented in its whole first
        (DNA) channel (``crops.anchor: nucleus``)."""
        dna = array.read((slice(0, 1), slice(None), slice(None)))
        return nucleus_centres(segment_nuclei(dna))

    def regions(
        self,
        rng: np.random.Generator,
        height: int,
        width: int,
        centres: np.ndarray | None = None,
    ) -> list[Region]:
        """The 2 global crops' regions, then the local crops' (each inside global crop
        ``i % 2`` with ``crops.local_in_global``), in pixels of a ``height x width`` field; the
        first centred on one of ``centres`` (nuclei, y and x) drawn at random when any are
        given (``crops.anchor``)."""
        c = self.crops
        field = c.scale_unit == "field"
        unit_g, unit_l = (None, None) if field else (c.global_size**2, c.local_size**2)
        first = sample_region(rng, height, width, c.global_scale, c.ratio, unit_g)
        if centres is not None and len(centres):
            centre = centres[int(rng.integers(len(centres)))]
            first = centred_on(first, (centre[0], centre[1]), c.anchor_jitter, rng, height, width)
        if c.global_window:
            window = around(first, c.global_window, height, width)
            second = sample_region_in(rng, window, height, width, c.global_scale, c.ratio, unit_g)
        else:
            second = sample_region(rng, height, width, c.global_scale, c.ratio, unit_g)
        out = [first, second]
        for i in range(c.n_local):
            if c.local_in_global:
                out.append(
                    sample_region_in(rng, out[i % 2], height, width, c.local_scale, c.ratio, unit_l)
                )
            else:
                out.append(sample_region(rng, height, width, c.local_scale, c.ratio, unit_l))
        return out

    def __getitem__(self, key: int | tuple[int, int]) -> dict[str, Any]:
        index, seed = (key, None) if isinstance(key, int) else key
        f = self.fields[index]
        array = self.open(index)
        if tuple(array.shape) != tuple(f.shape):
            raise DataError(
                f"{f.zarr_path}: shape {array.shape} differs from the manifest's {f.shape}"
            )
        label = -1 if f.label is None else int(f.label)
        c = self.crops
        if seed is None:
            _, h, w = array.shape
            g = c.global_size
            image = read_region(array, ((h - g) // 2, (w - g) // 2, g, g))
            return {"image": torch.from_numpy(image), "label": label, "index": index}
        rng = np.random.default_rng(seed)
        centres = self.nuclei(array) if c.anchor == "nucleus" else None
        pixels = read_regions(array, self.regions(rng, array.shape[1], array.shape[2], centres))
        globals_ = [self._crop(p, rng, c.global_size) for p in pixels[:2]]
        locals_ = [self._crop(p, rng, c.local_size) for p in pixels[2:]]
        jitter = [channel_jitter(rng, array.shape[0], c) for _ in range(2 + c.n_local)]
        size = c.local_size
        empty = np.zeros((0, array.shape[0], size, size), np.uint8)
        local = np.stack(locals_) if locals_ else empty
        return {
            "global": torch.from_numpy(np.stack(globals_)),
            "local": torch.from_numpy(local),
            "gain": torch.from_numpy(np.stack([j[0] for j in jitter])),
            "shift": torch.from_numpy(np.stack([j[1] for j in jitter])),
            "keep": torch.from_numpy(np.stack([j[2] for j in jitter])),
            "mask_seed": int(rng.integers(2**62)),  # the batch's iBOT masks (``collate``)
            "label": label,
            "index": index,
        }

    def collate(self) -> IbotCollate:
        """The training loader's ``collate_fn``: the batch's iBOT masks (``data/ibot_masks``)."""
        grid = self.crops.global_size // self.patch
        return IbotCollate((grid, grid), self.mask_probability, self.mask_ratio)


def scale(images: torch.Tensor) -> torch.Tensor:
    """uint8 -> float in [-1, 1], on the images' device."""
    return images.float() * (2.0 / 255.0) - 1.0


def to_views(
    batch: dict[str, Any], channel_stats: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The step's float views, crop-major (crop 0 of every field, then crop 1, ...):
    global ``[2B, C, G, G]``, local ``[LB, C, l, l]`` and masks ``[2B, N]``, with each crop's
    per-channel jitter applied in the units of the channel (``channel_stats``: its mean and std
    in the [-1, 1] input scale, the backbone's standardisation statistics; None: mean 0, std 1,
    the legacy input): the gain multiplies the intensity (a stain's brightness: a dark
    background stays dark), the shift is ``shift`` channel standard deviations, and a dropped
    channel is its mean (0 once standardised: no signal).

    Why not ``x * gain + shift`` on [-1, 1]: Cell Painting fields are mostly dark, a channel's
    std is ~0.15 in that scale and its background ~-0.9, so a 10 % gain moved the whole
    background by ~0.6 std and a 0.05 shift by ~0.3 std: a per-view offset of the entire crop,
    the strongest signal in it and one no other view shares. Measured on the demo twin: with it
    the DINO teacher's targets went uniform within 50 steps even for two views of the same
    region, without it they did not (docs/dinov2-recipe.md)."""
    g, loc = batch["global"], batch["local"]
    n_global = g.shape[1]
    gain = batch["gain"].float()[..., None, None]  # [B, V, C, 1, 1]
    shift = batch["shift"].float()[..., None, None]
    keep = batch["keep"].float()[..., None, None]
    channels = g.shape[2]
    if channel_stats is None:
        mean, std = (
            g.new_zeros(channels, dtype=torch.float32),
            g.new_ones(channels, dtype=torch.float32),
        )
    else:
        mean, std = (t.float().to(g.device) for t in channel_stats)
    mean, std = mean.view(1, 1, -1, 1, 1), std.view(1, 1, -1, 1, 1)

    def views(images: torch.Tensor, sl: slice) -> torch.Tensor:
        # [B, V, C, S, S]: the gain on the intensity, the shift in channel stds
        x: torch.Tensor = (scale(images) + 1.0) * gain[:, sl] - 1.0 + shift[:, sl] * std
        x = mean + (x - mean) * keep[:, sl]
        return x.transpose(0, 1).reshape(-1, *x.shape[2:])

    global_views = views(g, slice(0, n_global))
    local_views = views(loc, slice(n_global, None))
    masks = batch["masks"].transpose(0, 1).reshape(-1, batch["masks"].shape[-1])
    return global_views, local_views, masks


def fields_loader(
    dataset: CellPaintingDataset,
    cfg: DataConfig,
    batch_size: int,
    process_index: int,
    process_count: int,
    seed: int,
    start_step: int = 0,
) -> DataLoader[dict[str, Any]]:
    """Endless multi-crop batches for this process (keyed seeds: resumable, host-independent)."""
    sampler = EpochSampler(
        len(dataset), process_index, process_count, seed, start=start_step * batch_size
    )
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=True,
        collate_fn=dataset.collate(),
        **loader_kwargs(cfg),
    )
