"""The items of one part, read and cut for the encoder in loader workers (uint8 crosses the pipe).

* a Cell Painting field: its views (``encode.field_views``), uint8 ``[T, C, tile, tile]``;
* an OCT volume: the centre crop to the encoder's input shape, with no augmentation (what
  ``probe`` and ``evaluate`` read), uint8, and its neutral gain and shift.

``check_items`` refuses, before any work, items the encoder cannot read: another channel count
(or other channel names, when the checkpoint saved them), a field smaller than a tile, a volume
smaller than the input shape.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from octtrain.data.cellpainting import CellPaintingDataset, field_channels, field_shapes
from octtrain.data.dataset import Transform
from octtrain.data.volumeread import read_volume
from octtrain.embed.encode import field_views
from octtrain.embed.encoders import Encoder
from octtrain.errors import DataError
from octtrain.runtime.interrupt import quiet_worker_echoes


def check_items(items: Sequence[Any], encoder: Encoder, manifest: str) -> None:
    """DataError naming the manifest, the first item that does not fit and why."""
    if not len(items):
        return
    shapes = field_shapes(items)
    if encoder.data_kind == "cellpainting":
        wrong = np.flatnonzero(shapes[:, 0] != encoder.in_chans)
        if len(wrong):
            raise DataError(
                f"{manifest}: item {int(wrong[0])} has {int(shapes[wrong[0], 0])} channels, the "
                f"checkpoint's encoder reads {encoder.in_chans}: embed fields of the channels "
                "the run trained on"
            )
        found = field_channels(items)
        if encoder.channels is not None and found != encoder.channels:
            raise DataError(
                f"{manifest}: channels {list(found or ())}, the checkpoint trained on "
                f"{list(encoder.channels)}: the features would be read from other stains"
            )
        small = np.flatnonzero(shapes[:, 1:].min(axis=1) < encoder.tile)
        if len(small):
            _, h, w = shapes[small[0]]
            raise DataError(
                f"{manifest}: item {int(small[0])} is a {h}x{w} field, smaller than the "
                f"encoder's {encoder.tile}-pixel tile"
            )
        return
    assert encoder.input_shape is not None
    small = np.flatnonzero((shapes < np.array(encoder.input_shape)).any(axis=1))
    if len(small):
        raise DataError(
            f"{manifest}: item {int(small[0])} has shape {list(shapes[small[0]])}, smaller than "
            f"the encoder's input {list(encoder.input_shape)}"
        )


class PartItems(Dataset[dict[str, Any]]):
    """Items ``items`` (a part's view of the manifest) as the encoder reads them."""

    def __init__(self, items: Sequence[Any], root: Path, encoder: Encoder) -> None:
        self.kind, self.root = encoder.data_kind, root
        self.tile, self.shape = encoder.tile, encoder.input_shape
        if self.kind == "cellpainting":
            assert encoder.crops is not None
            self.fields = CellPaintingDataset(items, root, encoder.crops, 1)
        else:
            self.volumes = items
            assert self.shape is not None
            self.transform = Transform(self.shape, None)

    def __len__(self) -> int:
        return len(self.fields) if self.kind == "cellpainting" else len(self.volumes)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if self.kind == "cellpainting":
            tiles = field_views(self.fields.open(index).read(), self.tile)
            return {"tiles": torch.from_numpy(np.ascontiguousarray(tiles))}
        crop, gain, shift = self.transform(read_volume(self.root, self.volumes[index]), None)
        return {
            "image": torch.from_numpy(crop)[None],
            "gain": torch.tensor(gain, dtype=torch.float32),
            "shift": torch.tensor(shift, dtype=torch.float32),
        }


def _collate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Views as a list (fields have different counts of cells); volumes stacked."""
    if "tiles" in rows[0]:
        return {"tiles": [r["tiles"] for r in rows]}
    return {k: torch.stack([r[k] for r in rows]) for k in ("image", "gain", "shift")}


class PartsItems(Dataset[dict[str, Any]]):
    """The items of several parts as one dataset (part after part), so one set of loader
    workers reads ahead across part boundaries."""

    def __init__(self, views: Sequence[Sequence[Any]], root: Path, encoder: Encoder) -> None:
        self.parts = [PartItems(view, root, encoder) for view in views]
        self.starts = [0, *itertools.accumulate(len(p) for p in self.parts)]

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, index: int) -> dict[str, Any]:
        part = bisect.bisect_right(self.starts, index) - 1
        return self.parts[part][index - self.starts[part]]


def parts_loader(
    views: Sequence[Sequence[Any]],
    root: Path,
    encoder: Encoder,
    batch_size: int,
    num_workers: int,
) -> DataLoader[dict[str, Any]]:
    """The parts' items in order, ``batch_size`` a batch, no batch across two parts, read
    ahead by ``num_workers`` processes started once."""
    dataset = PartsItems(views, root, encoder)
    batches = [
        list(range(start + offset, start + min(offset + batch_size, len(view))))
        for start, view in zip(dataset.starts, views, strict=False)
        for offset in range(0, len(view), batch_size)
    ]
    return DataLoader(
        dataset,
        batch_sampler=batches,
        num_workers=num_workers,
        collate_fn=_collate,
        worker_init_fn=quiet_worker_echoes if num_workers else None,
    )
