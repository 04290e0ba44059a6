"""The QC sheet: the middle B-scan of a few cached volumes per device, after normalization.

A person glances at it after a build to catch what numbers miss: a device whose volumes come out
black, clipped, transposed or resized the wrong way. Drawn with matplotlib's Agg canvas (no
display, no global pyplot state).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import zarr
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from octstage.cachebuild.plan import qc_sample
from octstage.manifest import Volume

# A volume's zarr_path -> its array (``CacheStore.open_array``).
OpenArray = Callable[[str], zarr.Array[Any]]


def middle_bscan(open_array: OpenArray, volume: Volume) -> npt.NDArray[np.uint8]:
    """The middle frame of a cached volume (a folder cache reads only the chunks it covers)."""
    arr = open_array(volume.zarr_path)
    return np.asarray(arr[arr.shape[0] // 2], dtype=np.uint8)


def qc_sheet(open_array: OpenArray, volumes: Sequence[Volume], per_device: int = 4) -> bytes:
    """The sheet as PNG bytes; one row per device."""
    sample = qc_sample(volumes, per_device)
    devices = sorted({v.device for v in sample})
    rows, cols = max(1, len(devices)), max(1, min(per_device, len(sample)))
    fig = Figure(figsize=(3.2 * cols, 2.6 * rows), dpi=80)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for r, device in enumerate(devices):
        for c, volume in enumerate(v for v in sample if v.device == device):
            ax = axes[r][c]
            ax.imshow(
                middle_bscan(open_array, volume), cmap="gray", vmin=0, vmax=255, aspect="auto"
            )
            ax.set_title(f"{device}\n{volume.participant_id} {volume.laterality}", fontsize=8)
    if not sample:
        axes[0][0].text(0.5, 0.5, "no volumes in the manifest", ha="center", va="center")
    fig.suptitle(f"middle B-scans after normalization ({len(volumes)} volumes)")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png")
    return png.getvalue()
