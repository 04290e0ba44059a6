"""The finetuned model: a pretrained encoder (architecture checked) + a head, and its optimizer.

* The encoder comes from a pretraining checkpoint: the EMA target encoder by default (what
  V-JEPA evaluates), the online context encoder on request. The checkpoint records the model
  config it was trained with; every field that shapes the encoder's weights must match this
  run's ``model`` section, or the run stops naming each differing field.
* Optimizer groups: the head at ``head_lr``; encoder layer ``l`` of ``L = depth + 1`` at
  ``encoder_lr * layer_decay ** (L - l)`` (patch embedding ``l = 0``, block ``i`` is
  ``l = i + 1``, the final norm ``l = L``); no weight decay on biases, norms and 1-D tensors.
  While the encoder is frozen its groups are simply not in the optimizer; they are added at
  the unfreeze epoch (``Optimizer.add_param_group``), so frozen epochs really update nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from octtrain import checkpoint as ckpt
from octtrain.config import ModelConfig, from_dict, to_dict
from octtrain.errors import CheckpointError, ConfigError
from octtrain.finetune_config import (
    FinetuneConfig,
    FinetuneOptimConfig,
    FinetuneTrainConfig,
    HeadConfig,
)
from octtrain.models.heads import Classifier, ClassifierHead
from octtrain.models.vit3d import ViT3D, encoder_from_config, preset_for
from octtrain.schedules import warmup_cosine

ENCODER_KEYS = {"target": "target_encoder", "context": "encoder"}
# What the weights' shapes and meaning depend on (drop_path and the predictor do not matter).
ARCH_FIELDS = ("input_shape", "patch", "embed_dim", "depth", "num_heads", "mlp_ratio")


def _arch(cfg: ModelConfig) -> dict[str, Any]:
    p = preset_for(cfg)
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
        saved_cfg = from_dict(ModelConfig, dict(saved))
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
    return cfg


def load_pretrained_encoder(
    url: str, cfg: ModelConfig, which: str
) -> tuple[ViT3D, ModelConfig, dict[str, Any]]:
    """(encoder with pretrained weights, resolved model config, checkpoint info)."""
    state = ckpt.load_checkpoint(url)
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
    model_cfg = from_dict(ModelConfig, state["config"]["model"])
    head_cfg = from_dict(HeadConfig, state["config"]["head"])
    classes = tuple(state["classes"])
    encoder = encoder_from_config(model_cfg)
    model = build_classifier(encoder, head_cfg, preset_for(model_cfg).embed_dim, len(classes))
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        raise CheckpointError(f"classifier weights do not fit the config: {exc}") from exc
    return model, classes


def checkpoint_state(
    model: Classifier,
    cfg: FinetuneConfig,
    classes: tuple[str, ...],
    epoch: int,
    metrics: dict[str, Any],
    extra: dict[str, Any],
) -> dict[str, Any]:
    """What a finetuning checkpoint holds: CPU weights, the resolved config, the class names
    (evaluation refuses a manifest whose classes differ), the epoch's validation metrics."""
    return {
        "format": 1,
        "kind": "finetune",
        "epoch": epoch,
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "config": to_dict(cfg),
        "classes": list(classes),
        "metrics": metrics,
        **extra,
    }


def encoder_layer(name: str, depth: int) -> int:
    """Layer index of an encoder parameter for layer-wise decay (0 = patch embedding)."""
    if name.startswith("blocks."):
        return int(name.split(".")[1]) + 1
    if name.startswith(("patch_embed", "pos_embed")):
        return 0
    return depth + 1


def _decays(name: str, param: nn.Parameter) -> bool:
    return param.ndim >= 2 and not name.endswith(".bias") and "queries" not in name


def _split_decay(
    named: list[tuple[str, nn.Parameter]], weight_decay: float
) -> list[tuple[list[nn.Parameter], float]]:
    decay = [p for n, p in named if _decays(n, p)]
    plain = [p for n, p in named if not _decays(n, p)]
    return [(ps, wd) for ps, wd in ((decay, weight_decay), (plain, 0.0)) if ps]


def head_groups(model: Classifier, cfg: FinetuneOptimConfig) -> list[dict[str, Any]]:
    """Optimizer groups of the head (``base_lr`` is the peak; schedules scale it)."""
    named = list(model.head.named_parameters())
    return [
        {
            "params": ps,
            "weight_decay": wd,
            "base_lr": cfg.head_lr,
            "lr": cfg.head_lr,
            "part": "head",
        }
        for ps, wd in _split_decay(named, cfg.weight_decay)
    ]


def encoder_groups(model: Classifier, cfg: FinetuneOptimConfig, depth: int) -> list[dict[str, Any]]:
    """Optimizer groups of the encoder, one pair (decay / no decay) per layer."""
    layers: dict[int, list[tuple[str, nn.Parameter]]] = {}
    for name, param in model.encoder.named_parameters():
        layers.setdefault(encoder_layer(name, depth), []).append((name, param))
    groups = []
    for layer in sorted(layers):
        lr = cfg.encoder_lr * cfg.layer_decay ** (depth + 1 - layer)
        for ps, wd in _split_decay(layers[layer], cfg.weight_decay):
            groups.append(
                {
                    "params": ps,
                    "weight_decay": wd,
                    "base_lr": lr,
                    "lr": lr,
                    "part": "encoder",
                    "layer": layer,
                }
            )
    return groups


def build_optimizer(
    model: Classifier, cfg: FinetuneOptimConfig, depth: int, with_encoder: bool
) -> torch.optim.AdamW:
    """AdamW over the head, plus the encoder when it is trainable from the start."""
    groups = head_groups(model, cfg)
    if with_encoder:
        groups += encoder_groups(model, cfg, depth)
    return torch.optim.AdamW(groups, betas=cfg.betas, eps=cfg.eps)


def unfreeze(
    model: Classifier, optimizer: torch.optim.Optimizer, cfg: FinetuneOptimConfig, depth: int
) -> None:
    """Make the encoder trainable and give its groups to the optimizer (once)."""
    if any(g.get("part") == "encoder" for g in optimizer.param_groups):
        return
    model.freeze_encoder(False)
    for group in encoder_groups(model, cfg, depth):
        optimizer.add_param_group(group)


def set_learning_rates(
    optimizer: torch.optim.Optimizer, factor: float, encoder_factor: float
) -> dict[str, float]:
    """lr = base_lr * factor (head) or * encoder_factor (encoder); returns the peak-layer lrs."""
    out: dict[str, float] = {}
    for group in optimizer.param_groups:
        part = str(group.get("part", "head"))
        group["lr"] = group["base_lr"] * (encoder_factor if part == "encoder" else factor)
        out[f"lr_{part}"] = max(out.get(f"lr_{part}", 0.0), group["lr"])
    return out


def make_loss(weights: torch.Tensor | None, label_smoothing: float) -> nn.CrossEntropyLoss:
    """Weighted, smoothed cross-entropy: the mean over the batch divides by the sum of the
    targets' weights (PyTorch's definition), so weights change the balance, not the scale."""
    return nn.CrossEntropyLoss(weight=weights, label_smoothing=label_smoothing)


def lr_factors(
    step: int, steps_per_epoch: int, warmup_steps: int, total_steps: int, cfg: FinetuneTrainConfig
) -> tuple[float, float]:
    """(head, encoder) multipliers of the peak learning rates at optimizer ``step``.

    Linear warmup from ``1 / warmup_steps`` then cosine to ``min_lr_ratio``, clamped at the end.
    An encoder that thaws late warms up again from its unfreeze step, so its first updates
    do not hit pretrained weights at the full rate.
    """
    warm = max(warmup_steps, 1)
    factor = warmup_cosine(
        step,
        peak=1.0,
        warmup_steps=warmup_steps,
        total_steps=total_steps,
        start=1.0 / warm,
        final=cfg.min_lr_ratio,
    )
    encoder = factor
    if cfg.unfreeze_epoch:
        since = step - cfg.unfreeze_epoch * steps_per_epoch
        encoder = factor * min(1.0, max(0, since + 1) / warm)
    return factor, encoder
