"""Synthetic lesion volumes: a layered retina whose class is the NUMBER of small 3D lesions.

The probe benchmark (bench/bench_probe.py) needs a label carried by local 3D structure, not by a
global property a random encoder's mean-pooled features already expose (synth_oct.py's ONL
thickness moves a whole band, which a mean of random patch projections reads off linearly).

Each (frames, rows, columns) uint8 volume is, before noise:

* bands along the rows: vitreous 10, nerve-fibre layer 190 (``0.10 * rows``), a grey inner
  band 120 (``0.30 * rows``, the lesions' home), a dark ONL 50 (``0.12 * rows``), a bright RPE 220
  (``0.08 * rows``) and choroid 90 below; the band stack starts at ``0.15..0.25 * rows``, tilts
  across columns and wobbles smoothly;
* ``label`` lesions (0, 1, 2 or 3: the class), each an ellipsoid of semi-axes ``LESION_RADII``
  (2 frames, 2.5 rows, 3.5 columns; always 79 voxels, as centres sit on whole voxels)
  centred on the middle row of the inner band, on a frame in ``[2, frames - 3]`` and a column
  in ``[4, cols - 5]`` (so no lesion is cut by an edge), at least ``MIN_GAP`` voxels from every
  other lesion centre in the (frame, column) plane, so lesions never touch; each lesion is
  independently bright
  (245: a hyperreflective focus) or dark (15: a cyst) with probability 1/2, so in expectation
  lesions do not change the mean intensity;
* a per-volume gain in ``[0.85, 1.15]`` on everything, then (unless ``speckle=False``)
  multiplicative gamma speckle (shape 8, mean 1) and additive Gaussian noise (std 6).

So the class is the number of compact blobs in the inner band, whatever their sign; nothing else
depends on it. A lesion covers 79 voxels (0.5% of a 16x32x32 volume; it may straddle patches),
far less than the gain's effect on the mean, and bright and dark lesions cancel on average: to
read the label a model has to find and count local blobs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

NUM_CLASSES = 4  # 0..3 lesions
LESION_RADII = (2.0, 2.5, 3.5)  # semi-axes in (frames, rows, columns), voxels
MIN_GAP = 9.0  # least distance between lesion centres in the (frame, column) plane, voxels
BRIGHT, DARK, BAND = 245.0, 15.0, 120.0
# Band levels from the vitreous down, and each band's thickness as a fraction of the rows.
_LEVELS = (10.0, 190.0, BAND, 50.0, 220.0, 90.0)
_THICKNESS = (0.10, 0.30, 0.12, 0.08)


def _lesion_centres(
    count: int, frames: int, cols: int, rng: np.random.Generator
) -> list[tuple[int, int]]:
    """``count`` whole-voxel (frame, column) centres, MIN_GAP apart, each lesion inside."""
    mf, mc = (int(np.ceil(LESION_RADII[i])) for i in (0, 2))
    centres: list[tuple[int, int]] = []
    while len(centres) < count:
        f = int(rng.integers(mf, frames - mf))
        c = int(rng.integers(mc, cols - mc))
        if all(np.hypot(f - g, c - d) >= MIN_GAP for g, d in centres):
            centres.append((f, c))
        elif rng.random() < 0.05:
            centres = []  # an unlucky early draw can leave no room: start over
    return centres


def render_lesions(
    shape: tuple[int, int, int],
    label: int,
    rng: np.random.Generator,
    speckle: bool = True,
) -> npt.NDArray[np.uint8]:
    """A (frames, rows, columns) uint8 retina with ``label`` lesions in its inner band."""
    return render_lesions_with_mask(shape, label, rng, speckle)[0]


def render_lesions_with_mask(
    shape: tuple[int, int, int],
    label: int,
    rng: np.random.Generator,
    speckle: bool = True,
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
    """``render_lesions``'s volume (the same draws from ``rng``) and where its lesions are:
    what a token-level lesion probe scores an encoder's tokens against."""
    if not 0 <= label < NUM_CLASSES:
        raise ValueError(f"label must be in [0, {NUM_CLASSES}), got {label}")
    frames, rows, cols = shape
    f = np.arange(frames, dtype=np.float32)[:, None, None]
    r = np.arange(rows, dtype=np.float32)[None, :, None]
    c = np.arange(cols, dtype=np.float32)[None, None, :]
    phase = rng.uniform(0, 2 * np.pi, size=2)
    tilt = rng.uniform(-0.03, 0.03) * (c - cols / 2)
    wobble = 0.6 * np.sin(2 * np.pi * c / cols + phase[0]) + 0.4 * np.sin(f / 3 + phase[1])
    top = rows * rng.uniform(0.15, 0.25) + tilt + wobble  # (frames, 1, cols)
    vol = np.full((frames, rows, cols), _LEVELS[0], dtype=np.float32)
    edge = top
    edges = [top]
    for level, fraction in zip(_LEVELS[1:], (*_THICKNESS, 1.0), strict=True):
        below = edge + fraction * rows
        vol = np.where((r >= edge) & (r < below), level, vol)
        edges.append(below)
        edge = below
    band_top, band_bottom = edges[1], edges[2]  # the grey inner band
    lesions = np.zeros(shape, dtype=bool)
    for fc, cc in _lesion_centres(label, frames, cols, rng):
        rc = float(round(0.5 * (band_top[fc, 0, cc] + band_bottom[fc, 0, cc])))
        inside = ((f - fc) / LESION_RADII[0]) ** 2 + ((r - rc) / LESION_RADII[1]) ** 2
        inside = inside + ((c - cc) / LESION_RADII[2]) ** 2
        vol = np.where(inside <= 1.0, BRIGHT if rng.random() < 0.5 else DARK, vol)
        lesions |= inside <= 1.0
    out: npt.NDArray[np.floating[Any]] = vol * rng.uniform(0.85, 1.15)
    if speckle:
        out = out * rng.gamma(8.0, 1 / 8.0, size=out.shape) + rng.normal(0, 6, size=out.shape)
    volume: npt.NDArray[np.uint8] = np.clip(out, 0, 255).astype(np.uint8)
    return volume, lesions
