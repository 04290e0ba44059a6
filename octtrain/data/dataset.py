"""Manifest-fed volumes: a dataset that opens only the arrays the manifest lists.

``ManifestDataset`` never lists a folder and never calls out: each item is one ``zarr.open_array``
of ``cache_root / volume.array_path`` (reading its ``zarr.json`` and its one shard, checked
complete first: ``data/volumeread.py``). Items stay **uint8** ``[1, D, H, W]``, cropped to the
model's input shape and flipped in the loader workers; the intensity augmentation travels as two
floats per sample (``gain``, ``shift``) and ``to_model_input`` applies it with the scaling to [-1,
1] on the device, inside the step. A batch crosses the worker pipe and the host-to-device link at a
quarter of the float32 bytes. With a ``masker`` (pretraining) each item also carries its
context/target patch indices (int32), sampled in the worker.

Randomness is keyed, not stateful: the samplers yield ``(index, seed)`` pairs and everything
random about an item (crop, flips, intensity, mask) depends only on that seed; deterministic
items (validation) draw their mask from the item's index, the same at every validation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from octstage.manifest import Manifest, ManifestError, Volume, table_digest_problem
from octstage.manifest import load as load_manifest
from octstage.manifest import refuse as refuse_manifest
from octtrain.config.sections import AugmentConfig
from octtrain.data.volumeread import read_volume
from octtrain.errors import ConfigError, DataError

log = logging.getLogger("octtrain")
SampleKey = int | tuple[int, int]  # index, or (index, augmentation seed)
Masker = Callable[[np.random.Generator], tuple[np.ndarray, np.ndarray]]
MASK_STREAM = 1  # masks draw from (seed, MASK_STREAM); augmentations from seed itself
VAL_MASK_SEED = 12345  # deterministic items' masks: (VAL_MASK_SEED, index)


def read_manifest(path: str | None, consumer: str, kind: str | None = "oct") -> Manifest:
    """The manifest ``consumer`` (a key of ``octstage.manifest.FATAL``) reads, from local disk:
    its versions checked, then the one check of a manifest (``octstage.manifest.check``) run
    before any work: a DataError names the file and the findings fatal for ``consumer``; the
    others are logged as warnings. ``kind``: the kind the consumer reads (None: either)."""
    if path is None:
        raise ConfigError("data.manifest is not set (use --manifest FILE)")
    try:
        manifest = load_manifest(path)
    except ManifestError as exc:
        raise DataError(str(exc)) from exc
    changed = table_digest_problem(Path(path))
    if changed is not None:
        raise DataError(f"{path}: {changed}")
    refuse_manifest(manifest, path, consumer, DataError, kind, log.warning)
    return manifest


class Transform:
    """Crop to ``out_shape`` (random or centre) and flip, on uint8; draw the intensity jitter.

    Returns ``(crop, gain, shift)``: the uint8 crop and the parameters ``to_model_input`` applies
    on the device. With ``augment`` None (or no generator) it is deterministic: centre crop, no
    flip, gain 1, shift 0 (evaluation).
    """

    def __init__(self, out_shape: tuple[int, int, int], augment: AugmentConfig | None) -> None:
        self.out_shape = out_shape
        self.augment = augment

    def __call__(
        self, volume: np.ndarray, rng: np.random.Generator | None
    ) -> tuple[np.ndarray, float, float]:
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
        return np.ascontiguousarray(crop, dtype=np.uint8), float(gain), float(shift)


def to_model_input(batch: dict[str, Any]) -> torch.Tensor:
    """The float model input of a uint8 batch, on the batch's device: ``(v * 2/255 - 1) * gain
    + shift``, i.e. [-1, 1] before the intensity jitter, computed in one fused pass."""
    image: torch.Tensor = batch["image"]
    shape = (-1,) + (1,) * (image.dim() - 1)
    gain = batch["gain"].float().reshape(shape)
    shift = batch["shift"].float().reshape(shape)
    return torch.addcmul(shift - gain, image.float(), gain * (2.0 / 255.0))


class ManifestDataset(Dataset[dict[str, Any]]):
    """The volumes of one split of a manifest, read from a local cache folder.

    ``dataset[i]`` is deterministic (no augmentation); ``dataset[(i, seed)]`` augments with a
    generator seeded by ``seed``. Items: ``image`` uint8 ``[1, D, H, W]``, ``gain`` and ``shift``
    float32, ``label`` int, ``target`` float32 (the ``target_concept``'s clinical value, for a
    regression; 0 otherwise), ``index`` int (position in this dataset), ``participant_id`` str,
    and with a ``masker`` ``context_idx`` / ``target_idx`` int32.
    """

    def __init__(
        self,
        manifest: Manifest,
        cache_root: str | Path,
        split: str | None,
        transform: Transform | None = None,
        max_samples: int | None = None,
        masker: Masker | None = None,
        target_concept: int | None = None,
    ) -> None:
        volumes = manifest.volumes if split is None else manifest.split(split)
        self.target_key = None if target_concept is None else str(target_concept)
        self.volumes: Sequence[Volume] = volumes[:max_samples]
        self.cache_root = Path(cache_root)
        self.transform = transform
        self.split = split
        self.masker = masker

    def __len__(self) -> int:
        return len(self.volumes)

    def read(self, index: int) -> np.ndarray:
        """The stored uint8 array of volume ``index``; only its listed path is opened, and only
        a complete one is returned (``data/volumeread.py``)."""
        return read_volume(self.cache_root, self.volumes[index])

    def __getitem__(self, key: SampleKey) -> dict[str, Any]:
        index, seed = (key, None) if isinstance(key, int) else key
        volume = self.read(index)
        v = self.volumes[index]
        transform = self.transform or Transform(v.shape, None)  # none given: scale only
        crop, gain, shift = transform(volume, None if seed is None else np.random.default_rng(seed))
        item: dict[str, Any] = {
            "image": torch.from_numpy(crop)[None],
            "gain": torch.tensor(gain, dtype=torch.float32),
            "shift": torch.tensor(shift, dtype=torch.float32),
            "label": v.label,
            "target": torch.tensor(
                v.clinical.get(self.target_key, 0.0) if self.target_key else 0.0,
                dtype=torch.float32,
            ),
            "index": index,
            "participant_id": v.participant_id,
        }
        if self.masker is not None:
            mask_key = [VAL_MASK_SEED, index] if seed is None else [seed, MASK_STREAM]
            context, target = self.masker(np.random.default_rng(mask_key))
            item["context_idx"] = torch.from_numpy(context)
            item["target_idx"] = torch.from_numpy(target)
        return item


def volume_shape(volumes: Sequence[Volume]) -> tuple[int, int, int]:
    """The one shape shared by ``volumes``; DataError when the cache mixes shapes or is empty."""
    shapes = {tuple(v.shape) for v in volumes}
    if len(shapes) != 1:
        raise DataError(f"expected one volume shape in the cache, found {sorted(shapes) or 'none'}")
    d, h, w = shapes.pop()
    return (d, h, w)
