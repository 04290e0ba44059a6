"""Pure steps from a field's channel files to its uint8 array (no I/O).

``decode_tiff`` checks each file (one 2D plane, integer dtype: never assumed 16-bit);
``correct`` divides by the plate's illumination function; ``histogram`` counts a corrected
field's values per channel (rounded to 16 bits: 0..65535, the range of the raw images), and the
sum of a plate's histograms gives each channel's percentiles exactly (``plate_normalization``:
numpy's linear interpolation over the plate's rounded pixels) in constant memory, whatever the
plate's size; ``to_uint8`` clips to them and scales to 0..255.
"""

from __future__ import annotations

import io

import numpy as np
import numpy.typing as npt

from octstage.errors import CellPaintingError
from octstage.manifest import Normalization

HIST_BINS = 65536  # every value of a 16-bit image; corrected values are rounded into it


def decode_tiff(data: bytes, name: str) -> npt.NDArray[np.generic]:
    """The one 2D plane of a TIFF; CellPaintingError (a data rejection) for anything else."""
    import tifffile

    try:
        image = tifffile.imread(io.BytesIO(data))
    except Exception as exc:  # noqa: BLE001 - any decode failure of these bytes is the finding
        raise CellPaintingError(
            f"{name}: not a readable TIFF: {type(exc).__name__}: {exc}"
        ) from None
    if image.ndim != 2:
        raise CellPaintingError(f"{name}: expected one 2D plane, found shape {image.shape}")
    if image.dtype.kind not in "ui":
        raise CellPaintingError(f"{name}: pixel type {image.dtype} is not an integer type")
    return np.asarray(image)


def decode_illum(data: bytes, name: str) -> npt.NDArray[np.float32]:
    """An illumination function (``.npy``, 2D, positive; ``correct`` checks its shape)."""
    try:
        illum = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise CellPaintingError(f"{name}: not a readable .npy array: {exc}") from None
    if illum.ndim != 2:
        raise CellPaintingError(f"{name}: illumination function of shape {illum.shape}, not 2D")
    if not np.all(np.isfinite(illum)) or float(illum.min()) <= 0:
        raise CellPaintingError(f"{name}: illumination function has zero, negative or NaN values")
    out: npt.NDArray[np.float32] = illum.astype(np.float32)
    return out


def correct(
    image: npt.NDArray[np.generic], illum: npt.NDArray[np.float32] | None, name: str = "image"
) -> npt.NDArray[np.float32]:
    """Raw counts divided by the illumination function (when there is one); ``name`` (the
    image's file) is what an error names."""
    out = image.astype(np.float32)
    if illum is not None:
        if illum.shape != image.shape:
            raise CellPaintingError(
                f"{name}: illumination function of shape {illum.shape}, image {image.shape}"
            )
        out /= illum
    return out


def histogram(field: npt.NDArray[np.float32]) -> npt.NDArray[np.int64]:
    """``[C, 65536]``: per channel, how many pixels round to each 16-bit value (clipped)."""
    out = np.empty((field.shape[0], HIST_BINS), dtype=np.int64)
    for c in range(field.shape[0]):
        q = np.clip(np.rint(field[c]), 0, HIST_BINS - 1).astype(np.uint16)
        out[c] = np.bincount(q.ravel(), minlength=HIST_BINS)
    return out


def percentile(hist: npt.NDArray[np.int64], p: float) -> float:
    """The ``p`` percentile of the values ``hist`` counts, as ``np.percentile`` (linear
    interpolation between the two closest ranks) computes it over those values."""
    cum = np.cumsum(hist)
    n = int(cum[-1])
    if n == 0:
        raise CellPaintingError("percentile of an empty histogram")
    pos = p / 100.0 * (n - 1)
    lo = int(np.floor(pos))
    v_lo = int(np.searchsorted(cum, lo, side="right"))
    v_hi = int(np.searchsorted(cum, min(lo + 1, n - 1), side="right"))
    return float(v_lo + (pos - lo) * (v_hi - v_lo))


def plate_normalization(
    hist: npt.NDArray[np.int64], p_low: float, p_high: float
) -> tuple[Normalization, ...]:
    """Per channel, the ``p_low``/``p_high`` percentiles of the plate's summed histogram."""
    out = []
    for channel in hist:
        low, high = percentile(channel, p_low), percentile(channel, p_high)
        out.append(Normalization(p_low, p_high, low, max(high, low + 1e-3)))
    return tuple(out)


def to_uint8(
    field: npt.NDArray[np.float32], norms: tuple[Normalization, ...]
) -> npt.NDArray[np.uint8]:
    """Each channel clipped to its plate's [low, high] and scaled to 0..255 (rounded)."""
    out = np.empty(field.shape, dtype=np.uint8)
    for c, n in enumerate(norms):
        scaled = (field[c] - np.float32(n.low)) * np.float32(255.0 / (n.high - n.low))
        out[c] = np.rint(np.clip(scaled, 0, 255)).astype(np.uint8)
    return out
