"""CellProfiler's measurements of a Cell Painting field, with ``cp-measure`` (the profiling
field's handcrafted baseline; pure: a uint8 field in, one feature vector out).

* ``segment`` (``data/nuclei.py``, the one the encoders' single-cell views use too): nuclei are
  the connected components of the DNA channel above its Otsu threshold, cells the nuclei grown
  by a few pixels: the simple nuclei + propagated-cells recipe of a CellProfiler pipeline;
* ``cp_measure_features``: per object type (nuclei, cells) cp-measure's intensity, granularity,
  radial distribution, size/shape, Zernike and Feret measurements on every channel and the
  Pearson, Manders and RWC colocalisation of every channel pair, averaged over the field's
  objects (NaN-aware), then the object count. Haralick texture and Costes colocalisation are
  left out: together they take ~3x the rest's time on a 128 x 128 field, too slow for a CPU
  benchmark over every field. A field without a nucleus gives zeros (nothing measured).
"""

from __future__ import annotations

import warnings

import numpy as np
import numpy.typing as npt

from octtrain.data.nuclei import segment
from octtrain.eval.cellpainting.profiles import Array

CHANNELS = ("DNA", "AGP", "ER", "Mito", "RNA")
OBJECTS = ("nuclei", "cells")
GROUPS = (
    "intensity",
    "granularity",
    "radial_distribution",
    "sizeshape",
    "zernike",
    "feret",
    "correlation_pearson",
    "correlation_manders_fold",
    "correlation_rwc",
)
OFF = ("texture", "radial_zernikes", "correlation_costes")


def available() -> bool:
    """Whether cp-measure (the ``train`` extra) is installed."""
    try:
        import cp_measure.featurizer  # noqa: F401
    except ImportError:
        return False
    return True


def _config(channels: int) -> dict[str, object]:
    from cp_measure.featurizer import make_featurizer_config

    names = list(CHANNELS) if channels == len(CHANNELS) else [f"ch{i}" for i in range(channels)]
    flags = {g: True for g in GROUPS} | {g: False for g in OFF}
    config: dict[str, object] = make_featurizer_config(names, objects=list(OBJECTS), **flags)
    return config


def _probe(channels: int) -> npt.NDArray[np.uint8]:
    """A field with one square nucleus: what the feature names and length are read from."""
    probe = np.zeros((channels, 32, 32), np.uint8)
    probe[:, 8:20, 8:20] = 200
    return probe


def feature_names(channels: int) -> list[str]:
    """``<object>/<cp-measure column>`` for each feature, then ``nuclei_count``."""
    probe = _probe(channels)
    _, names = _measure(probe, *segment(probe))
    return names


def feature_count(channels: int) -> int:
    """The length of ``cp_measure_features``' vector for ``channels`` channels."""
    return len(feature_names(channels))


def _measure(
    field: npt.NDArray[np.uint8], nuclei: npt.NDArray[np.int32], cells: npt.NDArray[np.int32]
) -> tuple[Array, list[str]]:
    from cp_measure.featurizer import featurize

    image = (field.astype(np.float32) / 255.0)[None]
    with warnings.catch_warnings():
        # Ratios over empty radial bins and constant pixels warn and give NaN: averaged out.
        warnings.simplefilter("ignore")
        data, columns, rows = featurize(image, np.stack([nuclei, cells])[None], _config(len(field)))
        kinds = np.array([row[1] for row in rows])
        means = [np.nanmean(data[kinds == kind], axis=0) for kind in OBJECTS]
    out = np.concatenate([*means, [float(nuclei.max())]]).astype(np.float64)
    names = [f"{kind}/{c}" for kind in OBJECTS for c in columns] + ["nuclei_count"]
    return np.nan_to_num(out, nan=0.0, posinf=0.0, neginf=0.0), names


def cp_measure_features(field: npt.NDArray[np.uint8]) -> Array:
    """cp-measure's per-object measurements of ``field [C, Y, X]``, averaged per object type,
    then the nucleus count (see the module docstring)."""
    nuclei, cells = segment(field)  # once: the emptiness check and the measurements share it
    if not nuclei.any():
        return np.zeros(feature_count(field.shape[0]), np.float64)
    return _measure(field, nuclei, cells)[0]
