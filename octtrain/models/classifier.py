"""The finetuned model: a pretrained encoder (architecture checked) + a head.

The encoder comes from a pretraining checkpoint's state: the EMA target encoder by default (what
V-JEPA evaluates), the online context encoder on request, or none (random init: the supervised
reference). The checkpoint records the model config it was trained with; every field that shapes
the encoder's weights must match this run's ``model`` section, or the run stops naming each
differing field.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from octtrain.config.finetune import HeadConfig
from octtrain.config.loader import from_dict
from octtrain.config.sections import ModelConfig
from octtrain.errors import CheckpointError, ConfigError
from octtrain.models.heads import Classifier, ClassifierHead
from octtrain.models.inputs import legacy_model
from octtrain.models.vit3d import ViT3D, encoder_from_config

ENCODER_KEYS = {"target": "target_encoder", "context": "encoder"}
# What the weights' shapes and meaning depend on (drop_path and the predictor do not matter).
ARCH_FIELDS = ("input_shape", "patch", "embed_dim", "depth", "num_heads", "mlp_ratio")


def _arch(cfg: ModelConfig) -> dict[str, Any]:
    p = cfg.sizes()
    return {
        "input_shape": list(cfg.input_shape) if cfg.input_shape else None,
        "patch": list(cfg.patch),
        "embed_dim": p.embed_dim,
        "depth": p.depth,
        "num_heads": p.num_heads,
        "mlp_ratio": cfg.mlp_ratio,
    }


def resolve_model(cfg: ModelConfig, saved: dict[str, Any], source: str) -> ModelConfig:
    """This run's model config with ``input_shape`` taken from the checkpoint when unset;
    ``CheckpointError`` listing every architecture field that differs."""
    try:
        saved_cfg = from_dict(ModelConfig, legacy_model(dict(saved)))
    except ConfigError as exc:
        raise CheckpointError(f"{source}: unreadable model config in checkpoint: {exc}") from exc
    if cfg.input_shape is None:
        cfg = dataclasses.replace(cfg, input_shape=saved_cfg.input_shape)
    want, have = _arch(cfg), _arch(saved_cfg)
    diffs = [f"model.{k}: checkpoint {have[k]}, config {want[k]}" for k in ARCH_FIELDS]
    diffs = [d for k, d in zip(ARCH_FIELDS, diffs, strict=True) if want[k] != have[k]]
    if diffs:
        raise CheckpointError(
            f"{source}: the checkpoint's encoder architecture does not match the config: "
            + "; ".join(diffs)
            + f". Set the config's model section to the checkpoint's (preset {saved_cfg.preset!r})."
        )
    # The encoder keeps the input rule and positions it was trained with (models/inputs.py).
    return dataclasses.replace(cfg, input_norm=saved_cfg.input_norm, pos_embed=saved_cfg.pos_embed)


def encoder_from_state(
    state: dict[str, Any], url: str, cfg: ModelConfig, which: str
) -> tuple[ViT3D, ModelConfig, dict[str, Any]]:
    """(encoder with the pretrained weights of checkpoint ``state`` read from ``url``, resolved
    model config, checkpoint info)."""
    key = ENCODER_KEYS[which]
    if "config" not in state or "model" not in state.get("config", {}):
        raise CheckpointError(f"{url}: not a pretraining checkpoint (no config.model)")
    if key not in state:
        raise CheckpointError(f"{url}: no {key!r} in checkpoint (keys: {sorted(state)})")
    resolved = resolve_model(cfg, state["config"]["model"], url)
    encoder = encoder_from_config(resolved)
    try:
        encoder.load_state_dict(state[key])
    except RuntimeError as exc:
        raise CheckpointError(f"{url}: {key} weights do not fit the encoder: {exc}") from exc
    info = {
        "url": url,
        "encoder": key,
        "step": state.get("step"),
        "code": state.get("code_version"),
    }
    return encoder, resolved, info


def build_classifier(
    encoder: nn.Module, head: HeadConfig, embed_dim: int, num_classes: int
) -> Classifier:
    """Encoder + a freshly initialised head (the ViT3D encoder has no CLS token)."""
    try:
        return Classifier(encoder, ClassifierHead(head, embed_dim, num_classes, has_cls=False))
    except ValueError as exc:
        raise ConfigError(f"head: {exc}") from None


def classifier_from_state(state: dict[str, Any]) -> tuple[Classifier, tuple[str, ...]]:
    """Rebuild a finetuned classifier from its checkpoint (``finetune`` format)."""
    if state.get("kind") != "finetune":
        raise CheckpointError("not a finetuning checkpoint (kind != 'finetune')")
    model_cfg = from_dict(ModelConfig, legacy_model(state["config"]["model"]))
    head_cfg = from_dict(HeadConfig, state["config"]["head"])
    classes = tuple(state["classes"])
    encoder = encoder_from_config(model_cfg)
    model = build_classifier(encoder, head_cfg, model_cfg.sizes().embed_dim, len(classes))
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        raise CheckpointError(f"classifier weights do not fit the config: {exc}") from exc
    return model, classes


def make_loss(weights: torch.Tensor | None, label_smoothing: float) -> nn.CrossEntropyLoss:
    """Weighted, smoothed cross-entropy: the mean over the batch divides by the sum of the
    targets' weights (PyTorch's definition), so weights change the balance, not the scale."""
    return nn.CrossEntropyLoss(weight=weights, label_smoothing=label_smoothing)
