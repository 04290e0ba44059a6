"""Intensity normalization and anti-aliased resizing of one decoded OCT volume (pure numpy/OpenCV).

A volume arrives as uint8 (frames, rows, columns) from pydicom and leaves as uint8 on the target
grid (D, H, W):

1. p_low/p_high percentiles from a histogram of a strided subsample (``np.bincount`` on uint8 is
   ~100x cheaper than ``np.percentile`` on the full volume and lands within a grey level of it).
   The strides shrink until the sample holds at least ``MIN_SAMPLE`` voxels, and a volume
   smaller than that is taken whole: a fixed (2,4,4) stride left ~1,900 voxels of a 13x84x49
   volume and put p99 up to 37 grey levels off;
2. a 256-entry lookup table clips to [low, high] and stretches to 0..255 in float32, so
   clipping happens before averaging (the order a model would see if it had the full volume);
3. each B-scan is area-averaged in plane (OpenCV ``INTER_AREA``), and frames are combined with
   area weights when the frame count shrinks, linear weights when it grows. Output frames are
   built one at a time, so the float32 working set is a few B-scans, not a volume.

``"linear"`` resizing (bilinear in plane, linear across frames) exists for comparison only; it
aliases when shrinking.
"""

from __future__ import annotations

import functools
import math
from importlib import metadata

import cv2
import numpy as np
import numpy.typing as npt

from octstage.manifest import Normalization

RESIZE_METHODS = ("area", "linear")
# Bump by hand whenever this module (or the build's use of it) changes what a cached volume
# holds for the same source and parameters: it is part of every cache key.
# 2: percentiles from at least MIN_SAMPLE voxels; OME axes named for what they are.
PREPROCESS_VERSION = 2
MIN_SAMPLE = 1 << 20


def preprocess_versions() -> dict[str, str]:
    """This code's version and OpenCV's (its resize kernels make the output), for the key."""
    return {"octstage-preprocess": str(PREPROCESS_VERSION), "opencv": _opencv_version()}


@functools.cache
def _opencv_version() -> str:
    # Cached: a metadata lookup scans sys.path, and the cache key is computed per source file.
    try:
        return metadata.version("opencv-python-headless")
    except metadata.PackageNotFoundError:
        return str(cv2.__version__)  # another OpenCV wheel: its own version string


def histogram_percentiles(
    volume: npt.NDArray[np.uint8],
    p_low: float,
    p_high: float,
    subsample: tuple[int, int, int] = (2, 4, 4),
) -> tuple[float, float]:
    """``np.percentile(volume[::a, ::b, ::c], [p_low, p_high])`` computed from a histogram,
    with the strides of ``sample_strides`` (``subsample`` at most).

    Same definition as numpy's default (linear interpolation between order statistics), but
    O(n) on uint8 instead of a partial sort.
    """
    if volume.dtype != np.uint8:
        raise ValueError(f"histogram percentiles need uint8 data, got {volume.dtype}")
    if volume.size == 0:
        raise ValueError("cannot take percentiles of an empty volume")
    a, b, c = sample_strides(volume.shape, subsample)
    sample = volume[::a, ::b, ::c]
    counts = np.bincount(sample.ravel(), minlength=256)
    cdf = np.cumsum(counts)
    n = int(cdf[-1])
    return _order_stat(cdf, n, p_low), _order_stat(cdf, n, p_high)


def sample_strides(
    shape: tuple[int, ...], subsample: tuple[int, int, int], minimum: int = MIN_SAMPLE
) -> tuple[int, int, int]:
    """``subsample``, with the largest stride reduced one step at a time until the strided
    sample holds ``minimum`` voxels (all strides 1, the whole volume, when it is smaller)."""
    strides = [max(1, int(s)) for s in subsample]

    def held() -> int:
        return math.prod(-(-n // s) for n, s in zip(shape, strides, strict=True))

    while held() < minimum and max(strides) > 1:
        strides[strides.index(max(strides))] -= 1
    return strides[0], strides[1], strides[2]


def _order_stat(cdf: npt.NDArray[np.int64], n: int, p: float) -> float:
    position = p / 100.0 * (n - 1)
    below = math.floor(position)
    frac = position - below
    # The k-th smallest value (0-based) is the first grey level whose cumulative count exceeds k.
    v0 = int(np.searchsorted(cdf, below, side="right"))
    if frac == 0.0:
        return float(v0)
    v1 = int(np.searchsorted(cdf, below + 1, side="right"))
    return float(v0 + frac * (v1 - v0))


def intensity_lut(low: float, high: float) -> npt.NDArray[np.float32]:
    """Grey level -> clip((v - low) / (high - low)) * 255, as float32 (a flat volume maps to 0)."""
    levels = np.arange(256, dtype=np.float64)
    span = high - low
    if span <= 0:
        return np.where(levels > low, 255.0, 0.0).astype(np.float32)
    return (np.clip((levels - low) / span, 0.0, 1.0) * 255.0).astype(np.float32)


def axis_weights(n_in: int, n_out: int, method: str) -> tuple[tuple[tuple[int, float], ...], ...]:
    """1-D resampling from ``n_in`` to ``n_out`` samples: per output, its (source, weight) pairs.

    Area shrinking: each output averages the source interval it covers (overlap lengths, summing
    to 1). Linear, and any growing: two-tap interpolation at the output pixel centre (centres
    aligned, edges clamped, as OpenCV does in plane).
    """
    if n_in < 1 or n_out < 1:
        raise ValueError(f"axis sizes must be positive, got {n_in} -> {n_out}")
    scale = n_in / n_out
    sources: list[tuple[tuple[int, float], ...]] = []
    for i in range(n_out):
        if method == "area" and n_out < n_in:
            start, stop = i * scale, (i + 1) * scale
            pairs = [
                (k, (min(stop, k + 1) - max(start, k)) / scale)
                for k in range(math.floor(start), min(math.ceil(stop), n_in))
            ]
        else:
            x = min(max((i + 0.5) * scale - 0.5, 0.0), n_in - 1.0)
            k0 = math.floor(x)
            pairs = [(k0, 1.0 - (x - k0)), (k0 + 1, x - k0)]
        sources.append(tuple((k, w) for k, w in pairs if w > 1e-9))
    return tuple(sources)


def resize_plane(
    image: npt.NDArray[np.float32],
    rows: int,
    cols: int,
    method: str,
    out: npt.NDArray[np.float32] | None = None,
) -> npt.NDArray[np.float32]:
    """Resize one B-scan to (rows, cols): area when shrinking, bilinear when growing.

    OpenCV's INTER_AREA only averages when *both* axes shrink (otherwise it silently behaves like
    bilinear on both), so a mixed resize runs as two passes, one axis each. ``out``, when given,
    receives the result (no allocation in the per-B-scan loop).
    """
    h, w = image.shape
    if (h, w) == (rows, cols):
        if out is None:
            return image
        np.copyto(out, image)
        return out
    if method == "linear" or (rows >= h and cols >= w):
        return _cv_resize(image, rows, cols, cv2.INTER_LINEAR, out)
    if rows <= h and cols <= w:
        return _cv_resize(image, rows, cols, cv2.INTER_AREA, out)
    if rows < h:  # shrink rows, grow columns
        half = _cv_resize(image, rows, w, cv2.INTER_AREA)
    else:
        half = _cv_resize(image, h, cols, cv2.INTER_AREA)
    return _cv_resize(half, rows, cols, cv2.INTER_LINEAR, out)


def _cv_resize(
    image: npt.NDArray[np.float32],
    rows: int,
    cols: int,
    flag: int,
    out: npt.NDArray[np.float32] | None = None,
) -> npt.NDArray[np.float32]:
    resized = cv2.resize(image, (cols, rows), dst=out, interpolation=flag)
    return np.asarray(resized, dtype=np.float32)


def resize_volume(
    volume: npt.NDArray[np.uint8],
    shape: tuple[int, int, int],
    lut: npt.NDArray[np.float32] | None = None,
    method: str = "area",
) -> npt.NDArray[np.uint8]:
    """(frames, rows, cols) uint8 -> (D, H, W) uint8, each grey level first mapped by ``lut``.

    Output frames are built one at a time from the few source B-scans they need, so nothing
    bigger than the uint8 output is ever held in float. Both resampling steps are linear, so
    their order only changes float rounding: when frames shrink (e.g. 256 -> 64) B-scans are
    combined first and only the combined ones are resized, otherwise each B-scan is resized
    once and reused by the (up to two) output frames that need it.

    The loop allocates nothing: dask workers run with glibc's ``MALLOC_TRIM_THRESHOLD_`` set,
    which makes every multi-megabyte temporary a fresh mmap and page faults (measured: the
    same code twice as slow in a worker as in a plain process before the buffers were reused).
    """
    if method not in RESIZE_METHODS:
        raise ValueError(f"resize method must be one of {RESIZE_METHODS}, got {method!r}")
    if volume.ndim != 3 or volume.dtype != np.uint8:
        raise ValueError(f"expected a 3-D uint8 volume, got {volume.ndim}-D {volume.dtype}")
    depth, rows, cols = shape
    table = lut if lut is not None else np.arange(256, dtype=np.float32)
    frames_first = depth < volume.shape[0]
    plane_shape = volume.shape[1:] if frames_first else (rows, cols)
    mapped = np.empty(volume.shape[1:], dtype=np.float32)
    acc = np.empty(plane_shape, dtype=np.float32)
    resized = np.empty((rows, cols), dtype=np.float32)
    spare: list[npt.NDArray[np.float32]] = []  # buffers of B-scans no longer needed

    def plane(k: int) -> npt.NDArray[np.float32]:
        buf = spare.pop() if spare else np.empty(plane_shape, dtype=np.float32)
        if frames_first:
            cv2.LUT(volume[k], table, dst=buf)
        else:
            cv2.LUT(volume[k], table, dst=mapped)
            resize_plane(mapped, rows, cols, method, out=buf)
        return buf

    out = np.empty((depth, rows, cols), dtype=np.uint8)
    planes: dict[int, npt.NDArray[np.float32]] = {}
    for i, pairs in enumerate(axis_weights(volume.shape[0], depth, method)):
        first = pairs[0][0]
        for k in [k for k in planes if k < first]:
            spare.append(planes.pop(k))  # sources only move forward: never needed again
        acc.fill(0.0)
        for k, weight in pairs:
            if k not in planes:
                planes[k] = plane(k)
            cv2.scaleAdd(planes[k], weight, acc, dst=acc)
        combined = resize_plane(acc, rows, cols, method, out=resized) if frames_first else acc
        cv2.convertScaleAbs(combined, dst=out[i])  # round half to even, saturate (as to_uint8)
    return out


def to_uint8(values: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
    """Round half to even and saturate to 0..255, like ``np.rint`` (input is never negative)."""
    return np.asarray(cv2.convertScaleAbs(values), dtype=np.uint8)


def normalize_volume(
    volume: npt.NDArray[np.uint8],
    shape: tuple[int, int, int],
    p_low: float = 1.0,
    p_high: float = 99.0,
    subsample: tuple[int, int, int] = (2, 4, 4),
    method: str = "area",
) -> tuple[npt.NDArray[np.uint8], Normalization]:
    """The whole per-volume step: percentiles, clip and stretch, resize, back to uint8."""
    low, high = histogram_percentiles(volume, p_low, p_high, subsample)
    resized = resize_volume(volume, shape, intensity_lut(low, high), method)
    return resized, Normalization(p_low=p_low, p_high=p_high, low=low, high=high)


def scaled_spacing(
    spacing_mm: tuple[float, float, float],
    source_shape: tuple[int, int, int],
    shape: tuple[int, int, int],
) -> tuple[float, float, float]:
    """Voxel spacing after resizing: the extent is kept, so spacing scales by n_in / n_out."""
    return (
        spacing_mm[0] * source_shape[0] / shape[0],
        spacing_mm[1] * source_shape[1] / shape[1],
        spacing_mm[2] * source_shape[2] / shape[2],
    )
