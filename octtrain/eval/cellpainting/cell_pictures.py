"""Pictures of a Cell Painting crop and of what the 2D encoder makes of it (pure numpy): the
channels side by side, the CLS token's attention per head over the first channel (DNA in JUMP's
order), and the patch features' first three principal components as RGB
(``eval/common/pictures.py``).
A model that attends to nuclei shows hot spots on them at the first image step only if the
pictures come early; these are written at the first step of every run."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from octtrain.eval.common.pictures import pca_rgb


def _grey(image: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
    """[-1, 1] (or any range) -> [0, 255], scaled per image so a dim channel stays visible."""
    x = np.asarray(image, dtype=np.float64)
    lo, hi = np.percentile(x, 1), np.percentile(x, 99)
    return np.clip((x - lo) / max(float(hi - lo), 1e-12), 0.0, 1.0) * 255.0


def channel_strip(crop: npt.NDArray[np.floating]) -> npt.NDArray[np.uint8]:
    """Grey uint8 ``[S, C * S]``: each channel of ``crop [C, S, S]`` as one tile."""
    return np.concatenate([_grey(c) for c in crop], axis=1).astype(np.uint8)


def attention_heads(
    channel: npt.NDArray[np.floating], weights: npt.NDArray[np.floating], patch: int
) -> npt.NDArray[np.uint8]:
    """RGB uint8 ``[S, H * S, 3]``: ``channel [S, S]`` in grey with each head's attention
    ``weights [H, gh, gw]`` over it in red, each head scaled from its least to its most
    attended patch."""
    grey = _grey(channel)
    tiles = []
    for w in np.asarray(weights, dtype=np.float64):
        w = (w - w.min()) / max(float(w.max() - w.min()), 1e-12)
        heat = np.kron(w, np.ones((patch, patch)))
        rgb = np.repeat(grey[..., None], 3, axis=2) * (1.0 - 0.6 * heat[..., None])
        rgb[..., 0] += 255.0 * 0.6 * heat
        tiles.append(np.clip(rgb, 0, 255))
    return np.concatenate(tiles, axis=1).astype(np.uint8)


def features_pca(
    tokens: npt.NDArray[np.floating], grid: tuple[int, int], patch: int
) -> npt.NDArray[np.uint8]:
    """RGB uint8 ``[gh * patch, gw * patch, 3]`` of patch features ``[N, D]``."""
    return pca_rgb(tokens, (1, *grid), (1, patch, patch))
