"""A small real cache for trainer tests: structured uint8 volumes in Zarr plus a real manifest.

Each volume is a layered "retina" (bands along the rows, tilted across columns, speckled) whose
second layer gets thicker with the class index, so a tiny model can learn the label; band
position, tilt and noise vary per volume so classes still overlap a little.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np

from octstage import manifest as mf
from octstage.cache.volumestore import volume_relpath, write_volume
from octstage.dataset.ids import DEVICES
from octstage.dataset.labels import STUDY_GROUPS

DEFAULT_SHAPE = (8, 32, 32)
DEFAULT_COUNTS = {"train": 8, "val": 2, "test": 2}  # volumes per class and split


def synth_volume(shape: tuple[int, int, int], label: int, rng: np.random.Generator) -> np.ndarray:
    """One retina-like uint8 volume whose layer-2 thickness encodes ``label``."""
    d, h, w = shape
    rows = np.arange(h, dtype=np.float32)[None, :, None]
    top = h * rng.uniform(0.25, 0.35) + rng.uniform(-1, 1) * np.linspace(-1, 1, w)[None, None, :]
    top = top + 0.5 * np.sin(np.arange(d, dtype=np.float32) / 2)[:, None, None]
    unit = h / 32
    thick = (1.5 + 1.5 * label + rng.uniform(-0.5, 0.5)) * unit
    vol = np.full((d, h, w), 20.0, dtype=np.float32)
    edges = [top, top + 2 * unit, top + 2 * unit + thick, top + 5 * unit + thick]
    for i, level in enumerate((200.0, 90.0, 160.0)):
        vol = np.where((rows >= edges[i]) & (rows < edges[i + 1]), level, vol)
    vol = vol * rng.gamma(8.0, 1 / 8.0, size=vol.shape) + rng.normal(0, 6, size=vol.shape)
    return np.clip(vol, 0, 255).astype(np.uint8)


def write_tiny_cache(
    root: Path,
    shape: tuple[int, int, int] = DEFAULT_SHAPE,
    counts: dict[str, int] | None = None,
    seed: int = 0,
) -> tuple[Path, Path]:
    """Write volumes under ``root/cache`` and ``root/cache/manifest.json``; (manifest, cache)."""
    counts = counts or DEFAULT_COUNTS
    cache = root / "cache"
    rng = np.random.default_rng(seed)
    volumes = []
    pid = 1000
    for split, per_class in counts.items():
        for i in range(per_class):
            for label, group in enumerate(STUDY_GROUPS):
                pid += 1
                array = synth_volume(shape, label, rng)
                volumes.append(
                    cached_volume(
                        cache,
                        str(pid),
                        f"k{pid:05d}",
                        array,
                        split=split,
                        label=label,
                        group=group,
                        device=DEVICES[i % len(DEVICES)],
                        laterality="LR"[pid % 2],
                        protocol="synthetic",
                    )
                )
    path = write_synthetic_manifest(
        cache, volumes, STUDY_GROUPS, "tiny-test", {"shape": list(shape)}
    )
    return path, cache


SPACING_MM = (0.1, 0.01, 0.01)


def cached_volume(
    cache: Path,
    participant_id: str,
    key: str,
    array: np.ndarray,
    *,
    split: str,
    label: int,
    group: str,
    device: str,
    laterality: str,
    protocol: str,
) -> mf.Volume:
    """``array`` written into ``cache`` as build-cache writes a volume, and its manifest record
    (a synthetic source: no DICOM file behind it)."""
    rel = volume_relpath(participant_id, key)
    checksum = write_volume(cache, rel, array, SPACING_MM, {"label": label})
    shape = (array.shape[0], array.shape[1], array.shape[2])
    return mf.Volume(
        participant_id=participant_id,
        device=device,
        laterality=laterality,
        protocol=protocol,
        split=split,
        study_group=group,
        label=label,
        source_path=f"synthetic/{participant_id}.dcm",
        source_sha1="0" * 40,
        source_size=0,
        transfer_syntax="1.2.840.10008.1.2.1",
        source_shape=shape,
        spacing_mm=SPACING_MM,
        zarr_path=rel,
        shape=shape,
        dtype="uint8",
        normalization=mf.Normalization(1.0, 99.0, 0.0, 255.0),
        checksum=checksum,
        cache_key=key,
        intensity=mf.Intensity.of(array, channels_first=False),
    )


def write_synthetic_manifest(
    cache: Path,
    volumes: list[mf.Volume],
    classes: tuple[str, ...],
    dataset: str,
    config: dict[str, object],
) -> Path:
    """``cache/manifest.json`` listing ``volumes`` (written last, as build-cache does)."""
    header = mf.Header(
        dataset=dataset,
        created=datetime.datetime.now(datetime.UTC).isoformat(),
        code_version=dataset,
        cache_version=mf.CACHE_VERSION,
        config_hash=dataset,
        config=config,
        counts=mf.count_summary(volumes, 0),
    )
    path = cache / "manifest.json"
    mf.write(mf.Manifest(header, classes, tuple(volumes)), path)
    return path
