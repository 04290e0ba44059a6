"""The input statistics a ViT standardises with (``input_norm: dataset``), pooled from the
manifest.

build-cache records each stored array's mean and standard deviation per channel
(``octstage.manifest.Intensity``); the train split's are pooled here (every item weighs the
same: a split's items share one shape). A manifest built before those statistics has none: the
run then falls back to ``DEFAULT_UINT8`` (mean 127.5, std 127.5 on the uint8 scale, which is the
legacy [-1, 1] input), logs a warning, and says to rebuild the cache.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from octstage.manifest import CommonRows, Intensity, ItemTable

log = logging.getLogger("octtrain")

DEFAULT_UINT8 = (127.5, 127.5)  # (mean, std): the identity on the [-1, 1] input


@dataclass(frozen=True)
class InputStats:
    """Per-channel mean and std on the stored uint8 scale, and where they came from."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    items: int  # items pooled; 0: the default

    def to_input(self) -> tuple[list[float], list[float]]:
        """The same statistics in the model input's scale (``v * 2/255 - 1``)."""
        return [m / 127.5 - 1.0 for m in self.mean], [max(s, 1e-3) / 127.5 for s in self.std]


def pooled(items: Sequence[object], channels: int, what: str = "the train split") -> InputStats:
    """The pooled statistics of the manifest items (Volumes or Fields) that record them; the
    default (with a warning) when none does. Items of the columnar manifest (an ``ItemTable``)
    and their ``CommonRows`` are pooled from the intensity column, building no item."""
    if isinstance(items, (ItemTable, CommonRows)):
        means, stds = _columns(items, channels)
        measured: Sequence[object] = range(len(means))
    else:
        found = [getattr(i, "intensity", None) for i in items]
        stats = [m for m in found if isinstance(m, Intensity) and len(m.mean) == channels]
        means = np.array([m.mean for m in stats], dtype="float64").reshape(-1, channels)
        stds = np.array([m.std for m in stats], dtype="float64").reshape(-1, channels)
        measured = stats
    if not measured:
        log.warning(
            "the manifest records no intensity statistics for %s (built before octstage "
            "measured them): standardising with the default mean %.1f, std %.1f per channel, "
            "i.e. the legacy [-1, 1] input; rebuild the cache to standardise with its own",
            what,
            *DEFAULT_UINT8,
        )
        return InputStats((DEFAULT_UINT8[0],) * channels, (DEFAULT_UINT8[1],) * channels, 0)
    if len(measured) < len(items):
        log.warning(
            "%d of %d items of %s record no intensity statistics; pooling the %d that do",
            len(items) - len(measured),
            len(items),
            what,
            len(measured),
        )
    n = len(measured)
    mean = [float(x) for x in means.mean(axis=0)]
    square = [float(x) for x in (stds**2 + means**2).mean(axis=0)]
    std = [math.sqrt(max(q - mu**2, 0.0)) for q, mu in zip(square, mean, strict=True)]
    return InputStats(tuple(mean), tuple(std), n)


def _columns(items: ItemTable[object] | CommonRows, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """``(means, stds)`` ``[n, channels]`` of the rows whose intensity has ``channels`` values.
    Of ``CommonRows`` (a split's row numbers over the table's column), picked by those numbers
    in numpy: the column is not copied for the split."""
    if isinstance(items, CommonRows):
        column, rows = items.all_intensity, items.rows
    else:
        column, rows = items.column_array("intensity").combine_chunks(), None
    mean, std = pc.struct_field(column, "mean"), pc.struct_field(column, "std")
    keep = pc.and_(column.is_valid(), pc.equal(pc.list_value_length(mean), channels))
    kept = np.asarray(pc.fill_null(keep, False).to_numpy(zero_copy_only=False), dtype=bool)
    every = bool(kept.all())  # the usual case: no row to leave out, nothing filtered
    chosen = np.flatnonzero(kept) if rows is None else rows[kept[rows]]
    out = []
    for part in (mean, std):
        part = part if every else part.filter(pa.array(kept))
        values = pc.list_flatten(part).to_numpy(zero_copy_only=False)
        values = np.asarray(values, dtype="float64").reshape(-1, channels)
        if rows is not None:  # the split's rows, by their place among the kept ones
            values = values[chosen if every else (np.cumsum(kept) - 1)[chosen]]
        out.append(values)
    return out[0], out[1]
