"""What a ViT does to its input before the first block: per-channel standardisation and the
position embedding (shared by the 2D and 3D ViTs; docs/learning-inputs.md).

The loaders hand the models float images in the [-1, 1] scale of ``data/dataset.py`` and
``data/cellpainting.py`` (uint8 crosses the worker pipe, the scaling happens on the device).
A dark, mostly constant background is then a large constant in every token, and fixed sin-cos
positions add about 0.7 per channel: the image was a few percent of a token at init. So:

* ``InputNorm`` standardises each channel, the model's first op: ``dataset`` with a mean and
  std per channel (buffers, saved with the weights, so fine-tuning and evaluation use the
  statistics the encoder was trained with), ``sample`` per sample and channel over its own
  pixels (DINO4Cells; for OCT the per-volume rule, which also removes a device's gain and
  offset), ``none`` the legacy [-1, 1] input.
* Positions are ``learned`` (a parameter initialised at std 0.02, DINOv2) or ``sincos``, the
  legacy fixed table at full scale, kept only so checkpoints from before this rule load.

A checkpoint whose config predates these options was trained with ``none`` and ``sincos``
(``LEGACY_INPUTS``); ``legacy_model`` fills them in so the encoder is rebuilt as it was trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from octtrain.config.sections import INPUT_NORMS, LEGACY_INPUTS

POS_STD = 0.02  # DINOv2's init of its learned position embedding
# Per-sample variance floor, in the [-1, 1] scale: a constant channel (a dropped Cell Painting
# channel, an empty OCT crop) becomes zeros instead of amplified quantisation noise.
SAMPLE_EPS = 1e-4


def legacy_model(saved: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's saved model config with the options it predates set to what it was
    trained with (``LEGACY_INPUTS``); a config that names them is returned unchanged."""
    return {**LEGACY_INPUTS, **saved}


class InputNorm(nn.Module):
    """Per-channel standardisation of ``x [B, C, *spatial]`` (see the module docstring)."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, channels: int, mode: str) -> None:
        super().__init__()
        if mode not in INPUT_NORMS:
            raise ValueError(f"input_norm {mode!r} is not one of {INPUT_NORMS}")
        self.mode, self.channels = mode, channels
        if mode == "dataset":
            # Identity until ``set_stats``; saved with the weights (persistent buffers).
            self.register_buffer("mean", torch.zeros(channels))
            self.register_buffer("std", torch.ones(channels))

    def set_stats(self, mean: Sequence[float], std: Sequence[float]) -> None:
        """Set the per-channel statistics, in the model input's scale ([-1, 1])."""
        if self.mode != "dataset":
            return
        if len(mean) != self.channels or len(std) != self.channels:
            raise ValueError(
                f"input statistics for {len(mean)} channels, the model has {self.channels}"
            )
        with torch.no_grad():
            self.mean.copy_(torch.tensor(list(mean), dtype=torch.float32))
            self.std.copy_(torch.tensor(list(std), dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "none":
            return x
        view = (1, -1) + (1,) * (x.dim() - 2)
        if self.mode == "dataset":
            return (x - self.mean.view(view).to(x.dtype)) / self.std.view(view).to(x.dtype)
        dims = tuple(range(2, x.dim()))
        xf = x.float()
        var, mean = torch.var_mean(xf, dim=dims, keepdim=True, correction=0)
        return ((xf - mean) * torch.rsqrt(var + SAMPLE_EPS)).to(x.dtype)


def learned_positions(tokens: int, dim: int) -> nn.Parameter:
    """A learned position embedding ``[1, tokens, dim]``, truncated normal at std 0.02."""
    pos = nn.Parameter(torch.zeros(1, tokens, dim))
    nn.init.trunc_normal_(pos, std=POS_STD)
    return pos


def legacy_hint(diff: dict[str, Any]) -> str:
    """What to do when the only news in a checkpoint's model config is the input rule."""
    if not set(diff) & set(LEGACY_INPUTS):
        return ""
    pairs = ", ".join(f"model.{k}: {v}" for k, v in LEGACY_INPUTS.items())
    return (
        f". A checkpoint from before the input rule (docs/learning-inputs.md) was trained with "
        f"{pairs}: set those to resume it, or start a new run"
    )


def content_share(tokens: torch.Tensor) -> float:
    """The image's share of the tokens ``[B, N, D]``: variance across samples at a fixed
    position, over the tokens' mean square. What does not change with the image (positions,
    biases, a constant background) counts against it; 1 means the tokens are all image."""
    t = tokens.detach().float()
    across = t.var(dim=0, correction=0).mean()
    return float(across / t.square().mean().clamp_min(1e-12))
