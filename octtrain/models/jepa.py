"""V-JEPA pieces around the models: the trained student, the loss, the EMA target.

The student (context encoder + predictor) is the one module wrapped for data parallelism; the
target encoder is an EMA copy of the context encoder that is never trained and never wrapped.
The loss compares predictions with layer-normed target features at the masked positions.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from octtrain.config.sections import ModelConfig
from octtrain.models.predictor import Predictor, predictor_from_config
from octtrain.models.vit3d import ViT3D, encoder_from_config, gather_tokens


class JepaStudent(nn.Module):
    """Context encoder + predictor: ``forward(x, context_idx, target_idx) -> [B, K, D]``."""

    def __init__(self, encoder: ViT3D, predictor: Predictor) -> None:
        super().__init__()
        self.encoder = encoder
        self.predictor = predictor

    def forward(
        self, x: torch.Tensor, context_idx: torch.Tensor, target_idx: torch.Tensor
    ) -> torch.Tensor:
        context = self.encoder(x, context_idx)
        return self.predictor(context, context_idx, target_idx)  # type: ignore[no-any-return]


def build_student(cfg: ModelConfig) -> JepaStudent:
    """A fresh student for a resolved ModelConfig (seed torch first for identical replicas)."""
    encoder = encoder_from_config(cfg)
    return JepaStudent(encoder, predictor_from_config(cfg, encoder.grid))


def make_target(encoder: ViT3D) -> ViT3D:
    """The EMA target: a frozen copy of the context encoder, in eval mode for good (no drop
    path: its features are the regression targets)."""
    target = copy.deepcopy(encoder)
    target.requires_grad_(False)
    return target.eval()


@torch.no_grad()
def target_features(
    target: ViT3D, x: torch.Tensor, target_idx: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(layer-normed target features at ``target_idx`` [B, K, D], all tokens [B, N, D])."""
    tokens = target(x)
    normed = F.layer_norm(tokens, (tokens.shape[-1],))
    return gather_tokens(normed, target_idx), tokens


def jepa_loss(prediction: torch.Tensor, target: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-sample loss ``[B]``: mean L1 (V-JEPA) or mean squared error over tokens and channels.

    Computed in float32 whatever the autocast dtype of the inputs.
    """
    diff = prediction.float() - target.float()
    per_element = diff.abs() if kind == "l1" else diff.square()
    return per_element.mean(dim=(1, 2))


@torch.no_grad()
def ema_update(target: nn.Module, online: nn.Module, momentum: float) -> None:
    """target <- momentum * target + (1 - momentum) * online, parameter by parameter."""
    t_params: list[torch.Tensor] = list(target.parameters())
    o_params: list[torch.Tensor] = [p.detach() for p in online.parameters()]
    torch._foreach_lerp_(t_params, o_params, 1.0 - momentum)
