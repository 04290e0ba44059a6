"""The ``acquisition`` section: how much a training view may look as if another OCT device (or
another session of the same one) had acquired it (``data/acquisition.py`` applies it).

Every option's neutral value (the default) leaves the volume untouched, so a config that sets
nothing trains as before. Ranges are ``(low, high)``; a scalar ``max`` means uniform in
``[-max, max]``. The ranges of ``configs/pretrain/*.yaml`` and why they are what they are:
docs/device-invariance.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from octtrain.config.sections import check


def _range(name: str, value: tuple[float, float], low: float, high: float) -> None:
    lo, hi = value
    check(low <= lo <= hi <= high, f"{name} must satisfy {low} <= low <= high <= {high}")


@dataclass(frozen=True)
class AcquisitionConfig:
    """Generic acquisition changes drawn per view, on the raw uint8 volume before any scaling.

    Geometry (per view): ``lateral_scale`` resamples the A-scan (W) axis by a factor drawn
    log-uniformly (``> 1``: finer spacing, the retina looks wider), about the B-scan's centre;
    ``axial_shift`` moves the retina in depth (H) by up to that fraction of the depth window;
    ``tilt`` adds a depth offset that grows linearly across the B-scan, up to that fraction of the
    depth window from one edge to the other. Uncovered rows and columns repeat the edge.
    Intensity (per view, on the [0, 1] signal): ``speckle_looks`` multiplies each voxel by
    Gamma(L, 1/L) noise (mean 1, std ``1/sqrt(L)``), L drawn log-uniformly (0, 0: off);
    ``gamma`` raises the signal to an exponent drawn log-uniformly (the display curve); ``gain``
    multiplies it by a factor drawn log-uniformly; ``noise`` adds Gaussian noise whose std, in
    grey levels of 255, is drawn uniformly. ``p``: probability that a view gets a new look at all.
    ``two_looks`` (V-JEPA pretraining): the context and the target encoder see one geometry with
    two independently drawn intensity looks.
    """

    p: float = 1.0
    gain: tuple[float, float] = (1.0, 1.0)
    gamma: tuple[float, float] = (1.0, 1.0)
    speckle_looks: tuple[float, float] = (0.0, 0.0)
    noise: tuple[float, float] = (0.0, 0.0)
    axial_shift: float = 0.0
    tilt: float = 0.0
    lateral_scale: tuple[float, float] = (1.0, 1.0)
    # Pretraining only: the target encoder sees the same geometry with its own intensity look,
    # so predicting its features pays only for what every device shows alike.
    two_looks: bool = False

    def __post_init__(self) -> None:
        check(0.0 <= self.p <= 1.0, f"p must be a probability, got {self.p}")
        _range("gain", self.gain, 0.1, 10.0)
        _range("gamma", self.gamma, 0.1, 10.0)
        _range("noise", self.noise, 0.0, 128.0)
        _range("lateral_scale", self.lateral_scale, 0.25, 4.0)
        lo, hi = self.speckle_looks
        check(
            (lo, hi) == (0.0, 0.0) or 1.0 <= lo <= hi,
            f"speckle_looks must be (0, 0) (off) or 1 <= low <= high, got {self.speckle_looks}",
        )
        check(0.0 <= self.axial_shift <= 0.5, "axial_shift must be in [0, 0.5] of the depth")
        check(0.0 <= self.tilt <= 0.5, "tilt must be in [0, 0.5] of the depth")
        check(
            not self.two_looks or self.changes_intensity,
            "two_looks needs at least one intensity option (gain, gamma, speckle_looks, noise)",
        )

    @property
    def changes_intensity(self) -> bool:
        """Whether an intensity option is set (their neutral values are the defaults)."""
        return (
            self.gain != (1.0, 1.0)
            or self.gamma != (1.0, 1.0)
            or self.speckle_looks != (0.0, 0.0)
            or self.noise[1] > 0
        )

    @property
    def enabled(self) -> bool:
        """Whether any option would change a volume."""
        geometry = self.axial_shift > 0 or self.tilt > 0 or self.lateral_scale != (1.0, 1.0)
        return self.p > 0 and (geometry or self.changes_intensity)
