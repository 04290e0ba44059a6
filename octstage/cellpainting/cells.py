"""Draw synthetic Cell Painting fields: cells whose five channels show different compartments.

Pure numpy, no I/O. Each cell has a nucleus (DNA, filled), nucleoli inside it (RNA, bright
spots, plus faint cytoplasmic RNA), endoplasmic reticulum as a diffuse ring around the nucleus
(ER), mitochondria as puncta scattered in the cytoplasm (Mito) and a membrane outline with
actin fibres (AGP). A perturbation's ``Phenotype`` changes the morphology in documented ways
(``PHENOTYPES`` in ``families.py`` names them); the negative control is ``Phenotype()``.

Nuisance, the variation of a real screen that carries no phenotype (the profiling recipe and a
good encoder must see through it; a random encoder, which weighs raw intensity and texture,
mostly cannot):

* per well (``Nuisance.of_well``): each channel's stain intensity varies (log-normal, sd 0.15:
  dispensing and staining differ from well to well) and so does the cell density (a well's
  fields hold 3..10 cells around a well mean);
* per field (``to_uint16``): the focus varies (a Gaussian blur of sigma 0..1.2 px before the
  camera's noise), and the background count varies by +-25%;
* per plate: the gain (``synth.py``) and an illumination that is not quite the one its
  ``.npy`` describes (``illumination``'s ``shift``: the peak moves by up to 0.08 of the field),
  so a residual vignette survives the correction, different on each plate.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np
import numpy.typing as npt

from octstage.cellpainting.arrangement import (
    ER_WIDEN,
    aligned_fibres,
    er_network,
    lobed_blob,
    mito_place,
    nucleolus_radius,
    responds,
)

Image = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Phenotype:
    """Multipliers on the control morphology (1.0 = as the negative control)."""

    nucleus_size: float = 1.0  # nucleus radius
    cell_size: float = 1.0  # cell (membrane) radius
    mito_count: float = 1.0  # puncta per cell (their size shrinks as count grows: fission)
    er_spread: float = 1.0  # width of the ER ring around the nucleus
    agp_membrane: float = 1.0  # brightness of the membrane / actin outline
    nucleoli: float = 1.0  # nucleoli per nucleus (and cytoplasmic RNA)
    # The learned family (``arrangement.py``): where the stain lies, at the control's amount.
    mito_perinuclear: float = 0.0  # puncta moved toward the nucleus (0..1, same count and size)
    actin_aligned: float = 0.0  # a cell's fibres turned parallel and spread apart (0..1)
    nucleus_lobes: float = 0.0  # amplitude of a 3-lobed nuclear outline at the same area
    er_reticular: float = 0.0  # the ER ring as a tubular network at its mean and sd (0..1)
    nucleoli_rim: float = 0.0  # nucleoli moved out to the nuclear rim (0..1)
    responders: float = 1.0  # share of a well's cells that show the phenotype (others DMSO's)


CONTROL = Phenotype()


def changes(phenotype: Phenotype) -> dict[str, float]:
    """The fields of ``phenotype`` that differ from ``CONTROL``'s (DMSO's), with their values."""
    return {k: v for k, v in vars(phenotype).items() if v != getattr(CONTROL, k)}


CHANNEL_ORDER = ("DNA", "AGP", "ER", "Mito", "RNA")
STAIN_SD = 0.15  # log-normal sd of a well's per-channel stain intensity
FOCUS_SIGMA = (0.0, 1.2)  # per-field blur (px at 128 px fields)
BACKGROUND = 120.0  # camera background counts (+-25% per field)
FIBRES = 3  # actin fibres across a cell's cytoplasm


@dataclass(frozen=True)
class Nuisance:
    """A well's nuisance (see the module docstring): per-channel stain gain, cells per field."""

    stain: tuple[float, ...] = (1.0,) * len(CHANNEL_ORDER)
    cells: tuple[int, int] = (5, 9)  # rng.integers bounds of a field's cell count

    @staticmethod
    def of_well(rng: np.random.Generator) -> Nuisance:
        stain = np.exp(rng.normal(0.0, STAIN_SD, len(CHANNEL_ORDER)))
        low = int(rng.integers(3, 8))
        return Nuisance(tuple(float(s) for s in stain), (low, low + 3))


def _blob(yy: Image, xx: Image, cy: float, cx: float, r: float) -> Image:
    """A soft disk of radius ``r`` (1 inside, falling to 0 over ~1.5 px at the edge)."""
    d = np.sqrt((yy - cy) ** 2 + (xx - cx) ** 2)
    return np.clip((r - d) / 1.5 + 0.5, 0.0, 1.0).astype(np.float32)


def _ring(yy: Image, xx: Image, cy: float, cx: float, r: float, width: float) -> Image:
    d = np.sqrt((yy - cy) ** 2 + (xx - cx) ** 2)
    return np.exp(-(((d - r) / max(width, 0.5)) ** 2)).astype(np.float32)


def draw_field(
    rng: np.random.Generator, size: int, phenotype: Phenotype, cells: int
) -> npt.NDArray[np.float32]:
    """A float32 ``[5, size, size]`` field (channels in ``CHANNEL_ORDER``), values ~0..1."""
    out = np.zeros((5, size, size), dtype=np.float32)
    scale = size / 128.0
    for _ in range(cells):
        cy, cx = rng.uniform(0.08, 0.92, size=2) * size
        p = phenotype if responds(cy, cx, phenotype.responders) else CONTROL
        r_cell = float(rng.uniform(13, 17) * scale * p.cell_size)
        r_nuc = float(min(rng.uniform(5.0, 6.5) * scale * p.nucleus_size, 0.8 * r_cell))
        # Draw in a window around the cell (everything of it lies within r_cell + a margin).
        half = int(r_cell + 4 * scale + 3)
        y0, y1 = max(0, int(cy) - half), min(size, int(cy) + half + 1)
        x0, x1 = max(0, int(cx) - half), min(size, int(cx) + half + 1)
        yy, xx = np.mgrid[y0:y1, x0:x1].astype(np.float32)
        win = out[:, y0:y1, x0:x1]
        # The nucleus is a little elliptic: stretch one axis.
        stretch = float(rng.uniform(0.8, 1.2))
        if p.nucleus_lobes:
            phase = (stretch * 1000.0) % (2 * np.pi)  # no draw of its own (arrangement.py)
            nucleus = lobed_blob(
                cy + (yy - cy) * stretch, xx, cy, cx, r_nuc, p.nucleus_lobes, phase
            )
        else:
            nucleus = _blob(cy + (yy - cy) * stretch, xx, cy, cx, r_nuc)
        cell = _blob(yy, xx, cy, cx, r_cell)
        cytoplasm = np.clip(cell - nucleus, 0.0, 1.0)
        win[0] += nucleus * float(rng.uniform(0.7, 1.0))
        # ER: a ring hugging the nucleus, wider when spread, inside the cell.
        er_width = 2.5 * scale * p.er_spread
        er = _ring(yy, xx, cy, cx, r_nuc + er_width, er_width) * cell * 0.8 / p.er_spread**0.5
        if p.er_reticular:
            wide = _ring(yy, xx, cy, cx, r_nuc + er_width * ER_WIDEN, er_width * ER_WIDEN)
            er = er_network(er, wide, cell, cy, cx, p.er_reticular)
        win[2] += er
        # AGP: the membrane outline plus a few actin fibres across the cytoplasm.
        win[1] += _ring(yy, xx, cy, cx, r_cell, 1.2 * scale) * 0.7 * p.agp_membrane
        angles = [float(rng.uniform(0, np.pi)) for _ in range(FIBRES)]
        offsets = [0.0] * FIBRES
        if p.actin_aligned:
            angles, offsets = aligned_fibres(angles, r_nuc, p.actin_aligned)
        for angle, offset in zip(angles, offsets, strict=True):
            dist = np.abs((yy - cy) * np.cos(angle) - (xx - cx) * np.sin(angle) - offset)
            win[1] += np.exp(-((dist / (0.8 * scale)) ** 2)) * cytoplasm * 0.3 * p.agp_membrane
        # Mito: puncta in the cytoplasm; more and smaller when fragmented.
        n_mito = round(12 * p.mito_count)
        r_mito = 1.6 * scale / max(p.mito_count, 1.0) ** 0.5
        for k in range(n_mito):
            a = rng.uniform(0, 2 * np.pi)
            low, high = r_nuc + 0.5, max(r_nuc + 0.6, r_cell - 0.5)
            rr = rng.uniform(low, high)
            if p.mito_perinuclear:
                rr, a = mito_place(rr, a, k, n_mito, low, high, p.mito_perinuclear)
            my, mx = cy + rr * np.sin(a), cx + rr * np.cos(a)
            win[3] += np.exp(-((yy - my) ** 2 + (xx - mx) ** 2) / (2 * r_mito**2)) * 0.9
        # RNA: nucleoli inside the nucleus, and a faint cytoplasm.
        for _ in range(max(1, round(2 * p.nucleoli))):
            a, rr = rng.uniform(0, 2 * np.pi), rng.uniform(0, 0.5 * r_nuc)
            if p.nucleoli_rim:
                rr = nucleolus_radius(rr, r_nuc, p.nucleoli_rim)
            win[4] += _blob(yy, xx, cy + rr * np.sin(a), cx + rr * np.cos(a), 1.5 * scale)
        win[4] += cytoplasm * 0.15 * p.nucleoli
    return out


def illumination(
    size: int, channel: int, shift: tuple[float, float] = (0.0, 0.0)
) -> npt.NDArray[np.float32]:
    """A smooth vignette (the microscope's uneven illumination), ~0.55 at the corners and 1.0
    near an off-centre peak that differs per channel; CellProfiler's illum function is this
    field normalized so that dividing by it flattens the image. ``shift`` moves the peak (a
    plate whose true illumination is not the one its ``.npy`` describes)."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    py, px = 0.45 + 0.03 * channel + shift[0], 0.55 - 0.02 * channel + shift[1]
    vignette: npt.NDArray[np.float32] = (
        1.0 - 0.45 * ((yy - py) ** 2 + (xx - px) ** 2) / 0.5
    ).astype(np.float32)
    return vignette


def to_uint16(
    rng: np.random.Generator,
    field: npt.NDArray[np.float32],
    illum: npt.NDArray[np.float32],
    gain: float,
    stain: tuple[float, ...] | None = None,
) -> npt.NDArray[np.uint16]:
    """The camera: the field's focus, background, gain, the well's per-channel ``stain``
    intensity, uneven illumination (``illum``: [C, Y, X]) and shot noise, as 16-bit counts."""
    size = field.shape[-1]
    sigma = float(rng.uniform(*FOCUS_SIGMA)) * size / 128.0
    if sigma > 0.05:
        field = np.stack([cv2.GaussianBlur(c, (0, 0), sigma) for c in field])
    gains = np.asarray(stain if stain is not None else (1.0,) * len(field), np.float32)
    background = BACKGROUND * float(rng.uniform(0.75, 1.25))
    signal = (background + field * 2500.0 * gain * gains[:, None, None]) * illum
    noisy = rng.poisson(np.clip(signal, 0, None)).astype(np.float64)
    counts: npt.NDArray[np.uint16] = np.clip(noisy, 0, 65535).astype(np.uint16)
    return counts
