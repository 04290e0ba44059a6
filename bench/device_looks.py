"""The lesion twin as devices render it: the four seen devices' looks, an unseen fifth drawn
from a seed, and the renderer (shared by bench_label_efficiency.py and bench_lesion_tokens.py).

Each device shows the same retina its own way, as real OCT devices differ: the band stack sits
at another depth (geometry), speckle and additive noise differ (noise), and gain and contrast
curve differ (intensity); the lesions (the label) are the same kind on every device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from octstage.dataset.synth_lesions import render_lesions_with_mask


@dataclass(frozen=True)
class Look:
    """How one device renders the twin: depth shift in rows, gain, contrast exponent, speckle
    shape (lower: stronger speckle) and additive noise."""

    row_shift: int
    gain: float
    gamma: float
    speckle: float
    noise: float


DEVICE_LOOK = {
    "heidelberg_spectralis": Look(0, 1.00, 1.00, 12.0, 4.0),
    "topcon_maestro2": Look(3, 0.90, 1.15, 8.0, 6.0),
    "topcon_triton": Look(-2, 1.10, 0.90, 10.0, 5.0),
    "zeiss_cirrus": Look(4, 0.95, 1.10, 6.0, 8.0),
}
UNSEEN = "unseen_device"  # the split (and device name) of the look no run trains on


def unseen_look(seed: int) -> Look:
    """A fifth device, drawn from ``seed``: no fine-tuning run and no pretraining sees it, and
    no augmentation range was set from it. Its ranges are wider than the four looks' spread in
    every parameter, so a draw may fall outside the convex hull of the four (the seed-0 draw is
    printed and saved with the results)."""
    rng = np.random.default_rng([seed, 26])
    return Look(
        row_shift=int(rng.choice([-6, -5, -4, 5, 6, 7])),  # outside every seen look's shift
        gain=round(float(np.exp(rng.uniform(np.log(0.75), np.log(1.3)))), 3),
        gamma=round(float(np.exp(rng.uniform(np.log(0.75), np.log(1.35)))), 3),
        speckle=round(float(rng.uniform(4.0, 16.0)), 2),
        noise=round(float(rng.uniform(3.0, 10.0)), 2),
    )


def render(
    shape: tuple[int, int, int], label: int, look: Look, rng: np.random.Generator
) -> npt.NDArray[np.uint8]:
    """A lesion volume as ``look``'s device would show it."""
    return render_with_mask(shape, label, look, rng)[0]


def render_with_mask(
    shape: tuple[int, int, int], label: int, look: Look, rng: np.random.Generator
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
    """``render``'s volume (the same draws) and where its lesions are, moved with the retina."""
    clean, lesions = render_lesions_with_mask(shape, label, rng, speckle=False)
    clean = clean.astype(np.float32)
    shifted = np.roll(clean, look.row_shift, axis=1)
    lesions = np.roll(lesions, look.row_shift, axis=1)
    if look.row_shift > 0:
        shifted[:, : look.row_shift] = clean[:, :1]  # vitreous fills the gap, not wrapped choroid
        lesions[:, : look.row_shift] = False
    elif look.row_shift < 0:
        shifted[:, look.row_shift :] = clean[:, -1:]
        lesions[:, look.row_shift :] = False
    out = 255.0 * (shifted / 255.0) ** look.gamma * look.gain
    out = out * rng.gamma(look.speckle, 1 / look.speckle, size=out.shape)
    out = out + rng.normal(0, look.noise, size=out.shape)
    return np.clip(out, 0, 255).astype(np.uint8), lesions
