"""The twin's arrangement phenotypes: where a cell's stain lies, not how much of it there is.

Pure numpy, no I/O. ``cells.draw_field`` calls these for the learned family
(``families.LEARNED``): perinuclear mitochondria, parallel actin fibres, lobed nuclei, a
reticular ER, nucleoli at the nuclear rim, and a responding subpopulation. Each keeps a cell's
stain per channel, its stained area and its pixel spread where the control's are (equal count
and size of puncta, equal nuclear area, an ER network scaled to the diffuse ring's mean and
standard deviation), so per-crop intensity statistics and a CellProfiler-style intensity set
cannot tell them from DMSO; what changes is spatial arrangement, which an encoder must learn
to see (a random filter bank pools it away).

None of them draws from the field's generator: each is a deterministic function of what
``draw_field`` already drew (positions, radii, angles) plus, for the ER's texture, a generator
seeded from the cell's drawn position. So a field of a learned phenotype and its DMSO twin,
drawn from the same seed, hold the same cells in the same places (the tests pair them), and
the fields of every earlier phenotype keep their bytes.
"""

from __future__ import annotations

import cv2
import numpy as np
import numpy.typing as npt

Image = npt.NDArray[np.float32]

LOBES = 3  # a lobed nucleus's outline: r(theta) = r0 (1 + a cos(3 theta + phase))
MITO_BAND = 0.5  # at mito_perinuclear=1 puncta lie in the inner half of the cytoplasm
RIM = (0.6, 0.9)  # nucleoli_rim=1: their distance from the nuclear centre, in nuclear radii
FIBRE_OFFSET = 0.45  # actin_aligned=1: the outer fibres' offset from the centre, in nuclear radii
ER_GRAIN = 3.0  # px: the smoothing of the noise whose zero crossings are the ER's tubules
ER_TUBULE = 0.6  # the tubules' width, in sd of that noise
ER_WIDEN = 1.3  # a reticular ER spreads over a ring this much wider than the diffuse one
ER_SHARPEST = 16.0  # the bisection's bound on the tubules' sharpness (their texture's power)


def responds(cy: float, cx: float, share: float) -> bool:
    """Whether the cell at (``cy``, ``cx``) shows its well's phenotype: ``share`` of cells do,
    chosen by the fractional digits of the drawn position (uniform, and no draw of its own)."""
    if share >= 1.0:
        return True
    return float((cy * 7919.0 + cx * 104729.0) % 1.0) < share


def lobed_blob(
    yy: Image, xx: Image, cy: float, cx: float, r: float, amplitude: float, phase: float
) -> Image:
    """A soft lobed disk of the same area as a disk of radius ``r`` (the mean of r(theta)^2 is
    r0^2 (1 + a^2 / 2)), edges as ``cells._blob``'s."""
    dy, dx = yy - cy, xx - cx
    d = np.sqrt(dy**2 + dx**2)
    r0 = r / np.sqrt(1.0 + amplitude**2 / 2.0)
    radius = r0 * (1.0 + amplitude * np.cos(LOBES * np.arctan2(dy, dx) + phase))
    blob: Image = np.clip((radius - d) / 1.5 + 0.5, 0.0, 1.0).astype(np.float32)
    return blob


def mito_place(
    drawn_r: float, drawn_a: float, k: int, count: int, low: float, high: float, share: float
) -> tuple[float, float]:
    """Punctum ``k`` of ``count``, perinuclear: its drawn distance in [``low``, ``high``] moved
    toward ``low`` (the nucleus) by ``share`` x ``MITO_BAND`` of the way, and its drawn angle
    kept in the k-th of ``count`` equal sectors. Spreading the puncta around the nucleus keeps
    them from piling up in the narrower band: overlapping puncta would be brighter peaks over
    less area, an intensity change rather than an arrangement."""
    radius = low + (drawn_r - low) * (1.0 - MITO_BAND * share)
    sector = 2 * np.pi / count
    angle = (k + (drawn_a % (2 * np.pi)) / (2 * np.pi)) * sector
    return radius, float(angle)


def nucleolus_radius(drawn: float, r_nuc: float, share: float) -> float:
    """A nucleolus's distance from the centre: the drawn one in [0, r_nuc / 2] moved ``share``
    of the way to its place on the rim (``RIM`` x ``r_nuc``, in the drawn order)."""
    inside = min(max(drawn / (0.5 * r_nuc), 0.0), 1.0)
    rim = r_nuc * (RIM[0] + (RIM[1] - RIM[0]) * inside)
    return drawn + (rim - drawn) * share


def aligned_fibres(
    angles: list[float], r_nuc: float, share: float
) -> tuple[list[float], list[float]]:
    """A cell's fibres turned ``share`` of the way to the first one's angle, and moved apart
    (offsets from the centre, evenly spread, the middle one through it) so that parallel
    fibres do not fall on one line. The offsets are a multiple of the nuclear radius: most of
    each fibre's length stays in the cytoplasm, as the control's fibres through the centre."""
    step = FIBRE_OFFSET * r_nuc * share
    count = len(angles)
    turned = [a + (angles[0] - a) * share for a in angles]
    return turned, [(k - (count - 1) / 2.0) * step for k in range(count)]


def er_network(
    diffuse: Image, wide: Image, cell: Image, cy: float, cx: float, strength: float
) -> Image:
    """A reticular ER in place of the ``diffuse`` ring: the ``wide`` ring times a tubular
    texture (the zero crossings of smoothed noise), its sharpness and scale chosen so that its
    mean and standard deviation over the window equal the diffuse ring's (``strength`` 0..1
    blends from the diffuse ring)."""
    seed = int(abs(cy) * 1000.0) * 100003 + int(abs(cx) * 1000.0)
    drawn = np.random.default_rng(seed).normal(size=diffuse.shape).astype(np.float32)
    noise: Image = cv2.GaussianBlur(drawn, (0, 0), ER_GRAIN).astype(np.float32)
    noise /= float(noise.std()) + 1e-6
    tubules = np.exp(-((noise / ER_TUBULE) ** 2)).astype(np.float32)
    support = wide * cell
    weight = float(support.sum())
    target_mean, target_sd = float(diffuse.mean()), float(diffuse.std())
    if target_mean <= 0.0 or weight <= 0.0:
        return diffuse
    target_cv = target_sd / target_mean

    def at(sharpness: float) -> Image:
        # tubules ** s stays >= 0 at any s, and its spread grows with s: narrower tubules
        texture = tubules**sharpness
        texture /= float((texture * support).sum()) / weight + 1e-9
        out: Image = (support * texture).astype(np.float32)
        return out

    low, high = 0.0, ER_SHARPEST
    for _ in range(24):  # the CV grows with the sharpness: bisect for the diffuse ring's
        mid = (low + high) / 2.0
        x = at(mid)
        below = float(x.std()) / max(float(x.mean()), 1e-9) < target_cv
        low, high = (mid, high) if below else (low, mid)
    network = at((low + high) / 2.0)
    network *= target_mean / max(float(network.mean()), 1e-9)
    blended: Image = (diffuse * (1.0 - strength) + network * strength).astype(np.float32)
    return blended
