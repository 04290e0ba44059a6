"""A Cell Painting field's nuclei and cells: the one segmentation that the encoders' single-cell
views (``embed/encode.py``) and the handcrafted baseline's measurements
(``eval/cellpainting/cp_features.py``) share (pure: a uint8 field in, label images out).

* ``segment`` (``segment_nuclei`` for the nuclei alone): nuclei are the connected components
  of the DNA channel (the first, in JUMP's order) above its Otsu threshold, after a light
  smoothing; cells are the nuclei grown by ``cell_expand`` pixels without merging
  (``skimage.segmentation.expand_labels``): the simple nuclei + propagated-cells recipe of a
  CellProfiler pipeline, without a membrane channel.
* ``nucleus_centres``: each nucleus's centre of mass, in label order.
* ``crop_start``: where a crop centred on a nucleus starts, kept inside the field (the one rule
  for the single-cell views of ``embed/encode.py`` and the anchored training crops of
  ``data/cellpainting.py``).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def segment_nuclei(field: npt.NDArray[np.uint8], min_area: int = 8) -> npt.NDArray[np.int32]:
    """The nuclei label image ``[Y, X]`` of a field ``[C, Y, X]`` (its first channel is read;
    see the docstring)."""
    from skimage.filters import gaussian, threshold_otsu
    from skimage.measure import label
    from skimage.morphology import remove_small_objects

    dna = gaussian(field[0].astype(np.float64), sigma=1.0, preserve_range=True)  # type: ignore[no-untyped-call]
    if float(dna.max()) <= float(dna.min()):  # a flat field: nothing to threshold
        return np.zeros(dna.shape, np.int32)
    # skimage is untyped: its calls are checked by the tests, not mypy.
    threshold = threshold_otsu(dna)  # type: ignore[no-untyped-call]
    foreground = remove_small_objects(dna > threshold, max_size=min_area - 1)
    return label(foreground).astype(np.int32)  # type: ignore[no-any-return, no-untyped-call]


def segment(
    field: npt.NDArray[np.uint8], cell_expand: int = 9, min_area: int = 8
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """(nuclei, cells) label images ``[Y, X]`` of a field ``[C, Y, X]`` (see the docstring)."""
    from skimage.segmentation import expand_labels

    nuclei = segment_nuclei(field, min_area)
    cells = expand_labels(nuclei, cell_expand)  # type: ignore[no-untyped-call]
    return nuclei, cells.astype(np.int32)


def nucleus_centres(nuclei: npt.NDArray[np.int32]) -> npt.NDArray[np.float64]:
    """``[N, 2]``: the (y, x) centre of mass of nuclei ``1..N`` of a label image (``[0, 2]``
    when there are none)."""
    count = int(nuclei.max())
    if not count:
        return np.zeros((0, 2), np.float64)
    # Sums over the nuclei's own pixels (numpy's bincount), not scipy.ndimage.center_of_mass,
    # which weighs every pixel of the field by a float grid per axis: the same centres, 23 ms
    # against 113 ms on a 1,080 px field with ~380 nuclei (JUMP's size), where the embedding
    # export and ``crops.anchor: nucleus`` run this once a field.
    ys, xs = np.nonzero(nuclei)
    labels = nuclei[ys, xs]
    pixels = np.bincount(labels, minlength=count + 1)[1:]
    sums = [np.bincount(labels, weights=c, minlength=count + 1)[1:] for c in (ys, xs)]
    return np.stack(sums, axis=1) / np.maximum(pixels, 1)[:, None]


def crop_start(
    centre: float | npt.NDArray[np.float64], side: int, limit: int, shift: int = 0
) -> npt.NDArray[np.int64]:
    """Along one axis of ``limit`` pixels, where a crop of ``side`` pixels centred on ``centre``
    (one or many) starts: ``rint(centre - (side - 1) / 2)`` moved by ``shift``, kept inside
    ``[0, limit - side]``. rint (half to even) and the clip are symmetric under a flip (start ->
    limit - side - start) when ``limit - side`` is even: a turned field gets the same crops,
    turned."""
    start = np.rint(np.asarray(centre, np.float64) - (side - 1) / 2).astype(np.int64) + shift
    return np.clip(start, 0, limit - side)
