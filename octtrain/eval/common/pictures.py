"""Pictures of what the encoder represents (pure numpy): patch features projected on their
first three principal components and shown as RGB, one tile per layer of patches. Patches with
similar features get similar colours, so learned anatomy shows as coherent colour bands long
before any probe; a collapsed encoder shows one flat colour."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def pca_rgb(
    tokens: npt.NDArray[np.floating],
    grid: tuple[int, int, int],
    patch: tuple[int, int, int],
    max_slices: int = 8,
) -> npt.NDArray[np.uint8]:
    """RGB uint8 strip ``[H, W * layers, 3]`` of ``tokens [N, D]`` (N = prod(grid))."""
    x = np.asarray(tokens, dtype=np.float64)
    x = x - x.mean(axis=0, keepdims=True)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    comps = x @ vt[:3].T  # [N, <=3]
    if comps.shape[1] < 3:
        comps = np.pad(comps, ((0, 0), (0, 3 - comps.shape[1])))
    lo, hi = np.percentile(comps, 1, axis=0), np.percentile(comps, 99, axis=0)
    rgb = np.clip((comps - lo) / np.maximum(hi - lo, 1e-12), 0.0, 1.0)
    cube = (rgb * 255).astype(np.uint8).reshape(*grid, 3)
    tiles = [
        np.kron(cube[layer], np.ones((*patch[1:], 1), dtype=np.uint8))
        for layer in range(min(grid[0], max_slices))
    ]
    return np.concatenate(tiles, axis=1)


def attention_overlay(
    bscan: npt.NDArray[np.floating],
    weights: npt.NDArray[np.floating],
    patch: tuple[int, int, int],
    query: tuple[int, int],
) -> npt.NDArray[np.uint8]:
    """RGB uint8 ``[H, W, 3]``: a B-scan (``bscan`` in [-1, 1]) with the attention ``weights``
    ``[gh, gw]`` of one query patch (marked by a white border) over its layer, in red, scaled
    from the least to the most attended patch."""
    grey = np.clip((np.asarray(bscan, dtype=np.float64) + 1.0) * 127.5, 0, 255)
    w = np.asarray(weights, dtype=np.float64)
    w = (w - w.min()) / max(float(w.max() - w.min()), 1e-12)  # contrast: near-uniform is common
    heat = np.kron(w, np.ones(patch[1:]))
    rgb = np.repeat(grey[..., None], 3, axis=2) * (1.0 - 0.6 * heat[..., None])
    rgb[..., 0] += 255.0 * 0.6 * heat
    qh, qw = query
    ph, pw = patch[1:]
    box = rgb[qh * ph : (qh + 1) * ph, qw * pw : (qw + 1) * pw]
    box[[0, -1], :] = 255.0
    box[:, [0, -1]] = 255.0
    return np.clip(rgb, 0, 255).astype(np.uint8)
