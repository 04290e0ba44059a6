"""Acquisition augmentations: a training view as another OCT device might have acquired it.

Devices differ in how they render the same retina: where the retina sits in the depth window,
how the B-scan is tilted, how far apart the A-scans are, how much speckle survives their
averaging, and the gain and display curve that map the signal to grey levels. An encoder that
sees each device's look tied to that device learns the look; drawing these changes at random for
every view (``config/acquisition.py``: the ranges; docs/device-invariance.md: why) makes the look
a nuisance that carries no information about the sample.

Pure numpy on the uint8 crop in the loader workers, before any intensity scaling or
standardisation, so what crosses the worker pipe stays uint8. Geometry first (resampling,
depth shift and tilt act on the reflectivity), then speckle on the linear signal, then the
display curve and gain, then the additive noise floor; the result is clipped and rounded back to
uint8. Everything random comes from the item's generator: the same seed gives the same view.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from octtrain.config.acquisition import AcquisitionConfig
from octtrain.config.sections import AugmentConfig
from octtrain.data.dataset import ManifestDataset, SampleKey, Transform


@dataclass(frozen=True)
class Look:
    """One drawn acquisition: the parameters ``render`` applies (identity: ``Look()``).
    ``axial_shift`` and ``tilt`` are in rows (voxels of the depth axis)."""

    gain: float = 1.0
    gamma: float = 1.0
    speckle_looks: float = 0.0  # 0: no speckle
    noise: float = 0.0  # std in grey levels of 255
    axial_shift: float = 0.0
    tilt: float = 0.0
    lateral_scale: float = 1.0


def _log_uniform(rng: np.random.Generator, bounds: tuple[float, float]) -> float:
    lo, hi = bounds
    return lo if lo == hi else math.exp(rng.uniform(math.log(lo), math.log(hi)))


def draw(cfg: AcquisitionConfig, depth: int, rng: np.random.Generator) -> Look:
    """A look drawn from ``cfg``'s ranges for a volume of ``depth`` rows (H); the identity with
    probability ``1 - p`` or when every option is off."""
    if not cfg.enabled or rng.random() >= cfg.p:
        return Look()
    looks = cfg.speckle_looks
    return Look(
        gain=_log_uniform(rng, cfg.gain),
        gamma=_log_uniform(rng, cfg.gamma),
        speckle_looks=0.0 if looks == (0.0, 0.0) else _log_uniform(rng, looks),
        noise=float(rng.uniform(*cfg.noise)) if cfg.noise[1] > 0 else 0.0,
        axial_shift=float(rng.uniform(-cfg.axial_shift, cfg.axial_shift)) * depth,
        tilt=float(rng.uniform(-cfg.tilt, cfg.tilt)) * depth,
        lateral_scale=_log_uniform(rng, cfg.lateral_scale),
    )


def _weights(coords: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Linear interpolation at fractional ``coords`` into ``n`` samples, edges repeated: the
    lower and upper indices and the upper weight."""
    c = np.clip(coords, 0.0, n - 1.0)
    i0 = np.floor(c).astype(np.intp)
    return i0, np.minimum(i0 + 1, n - 1), (c - i0).astype(np.float32)


def lateral_resample(x: np.ndarray, scale: float) -> np.ndarray:
    """``x`` ``[D, H, W]`` resampled along W by ``scale`` about the centre, same size: an
    A-scan spacing ``1 / scale`` times the original (``scale > 1`` magnifies)."""
    if scale == 1.0:
        return x
    w = x.shape[2]
    centre = (w - 1) / 2
    i0, i1, f = _weights(centre + (np.arange(w) - centre) / scale, w)
    return np.asarray(x[..., i0] * (1 - f) + x[..., i1] * f, dtype=np.float32)


def depth_shift(x: np.ndarray, shift: float, tilt: float) -> np.ndarray:
    """``x`` ``[D, H, W]`` moved down the depth axis (H) by ``shift`` rows plus a tilt that goes
    from ``-tilt/2`` rows at the first A-scan to ``+tilt/2`` at the last, same size."""
    if shift == 0.0 and tilt == 0.0:
        return x
    h, w = x.shape[1], x.shape[2]
    across = np.linspace(-0.5, 0.5, w) if w > 1 else np.zeros(1)
    offset = shift + tilt * across  # [W]
    i0, i1, f = _weights(np.arange(h)[:, None] - offset[None, :], h)  # [H, W] each
    cols = np.arange(w)[None, :]
    return np.asarray(x[:, i0, cols] * (1 - f) + x[:, i1, cols] * f, dtype=np.float32)


def geometry(x: np.ndarray, look: Look) -> np.ndarray:
    """The float volume ``x`` resampled, shifted and tilted as ``look`` says."""
    return depth_shift(lateral_resample(x, look.lateral_scale), look.axial_shift, look.tilt)


def intensity(x: np.ndarray, look: Look, rng: np.random.Generator) -> np.ndarray:
    """The float signal ``x`` in [0, 1] with ``look``'s speckle, curve, gain and noise, as
    uint8."""
    if look.speckle_looks > 0:
        speckle = rng.standard_gamma(look.speckle_looks, x.shape, dtype=np.float32)
        x = x * (speckle / look.speckle_looks)
    if look.gamma != 1.0:
        x = np.power(np.clip(x, 0.0, None), look.gamma)
    x = x * look.gain
    if look.noise > 0:
        x = x + rng.standard_normal(x.shape, dtype=np.float32) * (look.noise / 255.0)
    return np.asarray(np.rint(np.clip(x, 0.0, 1.0) * 255.0), dtype=np.uint8)


def render(volume: np.ndarray, look: Look, rng: np.random.Generator) -> np.ndarray:
    """``volume`` (uint8 ``[D, H, W]``) as ``look`` renders it, uint8 again."""
    if look == Look():
        return volume
    return intensity(geometry(volume.astype(np.float32) / 255.0, look), look, rng)


def two_looks(
    volume: np.ndarray, cfg: AcquisitionConfig, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Two views of ``volume`` with one drawn geometry and two independently drawn intensity
    looks: the same retina at the same voxels, as two devices would render its signal."""
    first = draw(cfg, volume.shape[1], rng)
    other = draw(cfg, volume.shape[1], rng)
    other = dataclasses.replace(
        other,
        axial_shift=first.axial_shift,
        tilt=first.tilt,
        lateral_scale=first.lateral_scale,
    )
    x = geometry(volume.astype(np.float32) / 255.0, first)
    return intensity(x, first, rng), intensity(x, other, rng)


class AcquisitionTransform(Transform):
    """``Transform`` (crop, flips, intensity jitter) followed by a drawn acquisition look on the
    uint8 crop; deterministic items (no generator) are left as ``Transform`` makes them.

    With ``acquisition.two_looks`` the crop it returns is ``[2, D, H, W]``: the context's view
    and the target's (``two_looks``); ``TwoLookDataset`` splits them into two items.
    """

    def __init__(
        self,
        out_shape: tuple[int, int, int],
        augment: AugmentConfig | None,
        acquisition: AcquisitionConfig,
    ) -> None:
        super().__init__(out_shape, augment)
        self.acquisition = acquisition

    def __call__(
        self, volume: np.ndarray, rng: np.random.Generator | None
    ) -> tuple[np.ndarray, float, float]:
        crop, gain, shift = super().__call__(volume, rng)
        if rng is None or not self.acquisition.enabled:
            views = (crop, crop) if self.acquisition.two_looks else None
        elif self.acquisition.two_looks:
            views = two_looks(crop, self.acquisition, rng)
        else:
            look = draw(self.acquisition, crop.shape[1], rng)
            return np.ascontiguousarray(render(crop, look, rng)), gain, shift
        return (crop if views is None else np.stack(views)), gain, shift


class TwoLookDataset(ManifestDataset):
    """``ManifestDataset`` whose training items carry a second view for the target encoder:
    ``image`` (the context's look) and ``target_image`` (another look of the same geometry)
    from an ``AcquisitionTransform`` with ``two_looks`` on."""

    def __getitem__(self, key: SampleKey) -> dict[str, Any]:
        item = super().__getitem__(key)
        image = item["image"]  # [1, 2, D, H, W] from the stacked views
        item["image"], item["target_image"] = image[:, 0], image[:, 1]
        return item


def make_transform(
    out_shape: tuple[int, int, int], augment: AugmentConfig | None, acquisition: AcquisitionConfig
) -> Transform:
    """The training transform: ``Transform`` alone when no acquisition option is on."""
    if not acquisition.enabled:
        return Transform(out_shape, augment)
    return AcquisitionTransform(out_shape, augment, acquisition)
