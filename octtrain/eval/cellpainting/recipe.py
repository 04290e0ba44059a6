"""JUMP's profiling recipe for learned features, on well profiles (pure numpy: arrays in and out).

The steps, in the order the JUMP consortium's profiling recipe (``jump-profiling-recipe``, the
``var_mad_int_featselect`` pipelines, with pycytominer's operations) runs them:

0. ``variant`` (JUMP's ``var`` step, ``select_variant_features``): a feature with a NaN or an
   infinity anywhere is dropped, and so is one whose control wells, on any plate, have a median
   absolute deviation of 0 or one below ``VAR_MIN_CV`` x their median (JUMP's ``abs_coef_var``,
   which is 0 where the median is 0).
1. ``robust_z``, per plate: each feature minus the median of the plate's negative-control wells,
   over 1.4826 x their median absolute deviation (the MAD scaled to a normal's sd) plus
   ``epsilon`` (pycytominer's ``mad_robustize``). A plate with fewer than ``MIN_CONTROLS``
   control wells has no MAD to speak of: it is scaled against all its wells, and the notes say so.
2. ``rank_inverse_normal``, per feature over all wells: ranks (ties averaged) mapped through the
   normal quantile function with Blom's offset, ``Phi^-1((r - 3/8) / (n + 1/4))``: heavy tails
   and a few extreme wells no longer dominate a distance.
3. ``select_features``: pycytominer's ``variance_threshold`` (drop a feature whose second most
   common value is rarer than ``freq_cut`` x the most common, or with fewer distinct values than
   ``unique_cut`` x the wells: near-constant) then ``correlation_threshold`` (for each pair with
   |Pearson r| above ``corr_threshold``, most correlated first, drop the member with the higher
   mean |r| to all features, unless one of the pair is gone already).
4. ``sphere``: ZCA whitening fitted on the negative-control wells (pycytominer's ``Spherize``,
   ZCA with ``epsilon`` added to the eigenvalues) of the controls' Ledoit-Wolf covariance: with
   no more control wells than ``SPHERE_RATIO`` x the selected features the plain covariance is
   singular and whitening it would amplify its null directions (the notes then say how few wells
   there were); with many more wells the shrinkage shrinks and it comes close to pycytominer's.
   One estimator for every encoder, whatever its feature count: skipping the step, or shrinking
   only for some, would score them under another recipe.

JUMP then corrects batches (Harmony) across sources; the twin has one source and the per-plate
robust z-score is its batch correction. JUMP runs this recipe, unsphered, on its compound
profiles, CellProfiler's and deep-learning features alike (``compound.json``,
``compound_DL.json``: ``profiles_var_mad_int_featselect_harmony``): that is ``dl`` in
``scores.py``, the primary one. Sphering belongs to its ORF and CRISPR pipelines (with
well-position and cell-count corrections the twin does not need): that is ``sphered``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from scipy.special import ndtri
from scipy.stats import rankdata
from sklearn.covariance import ledoit_wolf

Array = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]

MAD_SCALE = 1.4826  # MAD of a normal distribution = 0.6745 sd
MIN_CONTROLS = 2  # control wells a plate needs for a median and a MAD
SPHERE_RATIO = 1.0  # a plain covariance needs more control wells than this x features
VAR_MIN_CV = 1e-3  # JUMP's var step: a feature's controls' MAD over their median, at least


@dataclass(frozen=True)
class RecipeConfig:
    """The recipe's thresholds (pycytominer's defaults; JUMP's recipe uses them)."""

    epsilon: float = 1e-6
    freq_cut: float = 0.05
    unique_cut: float = 0.01
    corr_threshold: float = 0.9
    sphere: bool = True
    sphere_epsilon: float = 1e-6

    def __post_init__(self) -> None:
        if self.epsilon <= 0 or self.sphere_epsilon <= 0:
            raise ValueError("epsilon and sphere_epsilon must be > 0")
        if not (0 < self.freq_cut < 1 and 0 < self.unique_cut < 1):
            raise ValueError("freq_cut and unique_cut must lie in (0, 1)")
        if not 0 < self.corr_threshold <= 1:
            raise ValueError(f"corr_threshold must lie in (0, 1], got {self.corr_threshold}")


@dataclass
class RecipeResult:
    """The profiles after the recipe, the input features kept, and what was skipped and why."""

    profiles: Array
    kept: npt.NDArray[np.int64]
    sphered: bool
    notes: list[str] = field(default_factory=list)


def plate_references(plates: Sequence[str], controls: Mask) -> list[tuple[str, Mask, Mask]]:
    """Per plate (sorted): its rows and the rows it is judged on, its control wells, or all its
    wells where it has fewer than ``MIN_CONTROLS`` (the var step and the z-score alike)."""
    plate_of = np.asarray(plates)
    out = []
    for plate in sorted(set(plates)):
        rows = plate_of == plate
        ref = rows & controls
        out.append((plate, rows, ref if int(ref.sum()) >= MIN_CONTROLS else rows))
    return out


def median_mad(ref: Array) -> tuple[Array, Array]:
    """Per feature, the median of ``ref``'s rows and their median absolute deviation (unscaled)."""
    centre = np.median(ref, axis=0)
    mad: Array = np.median(np.abs(ref - centre), axis=0)
    return centre, mad


def variant(x: Array, plates: Sequence[str], controls: Mask) -> Mask:
    """JUMP's ``var`` step: True for a feature to keep (module docstring), each plate judged on
    ``plate_references``' wells."""
    keep: Mask = np.asarray(np.isfinite(x).all(axis=0), dtype=bool)
    for _, _, ref in plate_references(plates, controls):
        centre, mad = median_mad(np.where(np.isfinite(x[ref]), x[ref], 0.0))
        with np.errstate(divide="ignore", invalid="ignore"):
            cv = np.abs(mad / centre)
        cv = np.where(np.isfinite(cv), cv, 0.0)  # JUMP's: 0/0 and x/0 count as 0
        keep = np.asarray(keep & (mad != 0) & (cv > VAR_MIN_CV), dtype=bool)
    return keep


def robust_z(x: Array, controls: Mask, epsilon: float = 1e-6) -> Array:
    """``(x - median(x[controls])) / (1.4826 * MAD(x[controls]) + epsilon)``, per feature."""
    centre, mad = median_mad(x[controls])
    out: Array = (x - centre) / (MAD_SCALE * mad + epsilon)
    return out


def robust_z_by_plate(
    x: Array, plates: Sequence[str], controls: Mask, epsilon: float = 1e-6
) -> tuple[Array, list[str]]:
    """``robust_z`` within each plate against its control wells (all its wells where it has
    fewer than ``MIN_CONTROLS``), and the notes naming such plates."""
    out = np.empty_like(x, dtype=np.float64)
    notes = []
    for plate, rows, ref in plate_references(plates, controls):
        if ref is rows:
            held = int((rows & controls).sum())
            notes.append(f"plate {plate}: {held} control well(s), scaled against all its wells")
        out[rows] = robust_z(x[rows], ref[rows], epsilon)
    return out, notes


def rank_inverse_normal(x: Array) -> Array:
    """Each column's ranks (ties averaged) through the normal quantile, Blom's offset 3/8."""
    n = x.shape[0]
    ranks = rankdata(x, axis=0, method="average")
    out: Array = ndtri((ranks - 0.375) / (n + 0.25))
    return out


def near_constant(x: Array, freq_cut: float = 0.05, unique_cut: float = 0.01) -> Mask:
    """pycytominer's ``variance_threshold``: True for a feature to drop (see the docstring)."""
    n = x.shape[0]
    drop = np.zeros(x.shape[1], dtype=bool)
    for j in range(x.shape[1]):
        _, counts = np.unique(x[:, j], return_counts=True)
        if len(counts) < 2:
            drop[j] = True
            continue
        top = np.sort(counts)[::-1]
        drop[j] = top[1] / top[0] < freq_cut or len(counts) / n < unique_cut
    return drop


def correlated(x: Array, threshold: float = 0.9) -> Mask:
    """pycytominer's ``correlation_threshold``: True for a feature to drop (see the docstring)."""
    d = x.shape[1]
    drop = np.zeros(d, dtype=bool)
    if d < 2 or x.shape[0] < 3:
        return drop
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.abs(np.corrcoef(x, rowvar=False))
    r = np.nan_to_num(r, nan=0.0)
    np.fill_diagonal(r, 0.0)
    mean_r = r.mean(axis=0)
    i, j = np.nonzero(np.triu(r > threshold, k=1))
    for k in np.argsort(-r[i, j], kind="stable"):
        a, b = int(i[k]), int(j[k])
        if drop[a] or drop[b]:
            continue
        drop[a if mean_r[a] >= mean_r[b] else b] = True
    return drop


def select_features(x: Array, cfg: RecipeConfig) -> npt.NDArray[np.int64]:
    """Indices of the features kept by ``near_constant`` then ``correlated``."""
    kept = np.flatnonzero(~near_constant(x, cfg.freq_cut, cfg.unique_cut))
    kept = kept[~correlated(x[:, kept], cfg.corr_threshold)]
    return kept.astype(np.int64)


def zca(reference: Array, epsilon: float = 1e-6, shrunk: bool = False) -> tuple[Array, Array]:
    """(mean, W) of ZCA whitening fitted on ``reference``: ``(x - mean) @ W`` has identity
    covariance on the reference (up to ``epsilon``). ``shrunk``: whiten the Ledoit-Wolf
    covariance instead (shrunk towards a scaled identity: defined with fewer rows than columns)."""
    mean = reference.mean(axis=0)
    if shrunk:
        cov = ledoit_wolf(reference - mean, assume_centered=True)[0]
    else:
        cov = np.cov(reference - mean, rowvar=False).reshape(reference.shape[1], -1)
    values, vectors = np.linalg.eigh(cov)
    w: Array = (vectors / np.sqrt(np.clip(values, 0.0, None) + epsilon)) @ vectors.T
    return mean, w


def sphere(x: Array, controls: Mask, epsilon: float = 1e-6, shrunk: bool = False) -> Array:
    """``x`` ZCA-whitened on its control wells (``shrunk``: see ``zca``)."""
    mean, w = zca(x[controls], epsilon, shrunk)
    out: Array = (x - mean) @ w
    return out


def can_sphere(n_controls: int, n_features: int) -> bool:
    """Whether the control wells can fit a whitening of ``n_features`` (see the docstring)."""
    return n_features > 0 and n_controls > SPHERE_RATIO * n_features


def apply_recipe(
    x: Array, plates: Sequence[str], controls: Mask, cfg: RecipeConfig | None = None
) -> RecipeResult:
    """The whole recipe on well profiles ``x`` ``[wells, features]`` (module docstring)."""
    cfg = cfg or RecipeConfig()
    if x.shape[0] != len(plates) or x.shape[0] != len(controls):
        raise ValueError(f"{x.shape[0]} wells, {len(plates)} plates, {len(controls)} flags")
    x = np.asarray(x, np.float64)
    variants = np.flatnonzero(variant(x, plates, controls)).astype(np.int64)
    notes = []
    if len(variants) < x.shape[1]:
        notes.append(
            f"var: {x.shape[1] - len(variants)} of {x.shape[1]} features dropped (not finite, or "
            f"a plate's controls' MAD 0 or below {VAR_MIN_CV:g} x their median)"
        )
    z, plate_notes = robust_z_by_plate(x[:, variants], plates, controls, cfg.epsilon)
    notes += plate_notes
    z = rank_inverse_normal(z)
    chosen = select_features(z, cfg)
    kept = variants[chosen]
    z = z[:, chosen]
    if not cfg.sphere:
        return RecipeResult(z, kept, False, [*notes, "sphering off"])
    n_controls = int(np.sum(controls))
    if n_controls < MIN_CONTROLS or not len(kept):
        notes.append(f"sphering skipped: {n_controls} control wells, {len(kept)} features")
        return RecipeResult(z, kept, False, notes)
    if not can_sphere(n_controls, len(kept)):
        notes.append(
            f"sphered on a Ledoit-Wolf covariance: {n_controls} control wells for {len(kept)} "
            f"features (a plain one needs more than {SPHERE_RATIO:g} per feature)"
        )
    # Shrunk for every encoder, whatever its feature count: plain where it could be and shrunk
    # elsewhere measured the recipe, not the encoder (on the library twin one random init of 41
    # features, 48 controls, scored distinctiveness 0.069 plain and 0.098 shrunk).
    white = sphere(z, controls, cfg.sphere_epsilon, shrunk=True)
    return RecipeResult(white, kept, True, notes)
