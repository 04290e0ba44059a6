"""Optimizers: AdamW groups and the per-step hyperparameters of both jobs.

Pretraining: two groups (decayed / not), the scheduled lr and weight decay set every step;
DINO: DINOv2's layer-wise lr decay and patch-embedding multiplier on top (``dino_optimizer``),
with AdamW's fused kernel where torch has one.
Finetuning: the head at ``head_lr``; encoder layer ``l`` of ``L = depth + 1`` at
``encoder_lr * layer_decay ** (L - l)`` (patch embedding ``l = 0``, block ``i`` is ``l = i + 1``,
the final norm ``l = L``); no weight decay on biases, norms and 1-D tensors. While the encoder is
frozen its groups are not in the optimizer; they are added when it thaws
(``Optimizer.add_param_group``), so frozen epochs really update nothing.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from octtrain.config.dino import DinoOptimConfig
from octtrain.config.finetune import FinetuneOptimConfig, FinetuneScheduleConfig
from octtrain.config.pretrain import OptimConfig
from octtrain.models.heads import Classifier
from octtrain.train.schedules import warmup_cosine


def no_weight_decay(name: str, param: nn.Parameter) -> bool:
    """Biases, norm scales and other 1-D parameters are not decayed."""
    return param.ndim < 2 or name.endswith(".bias")


def pretrain_optimizer(module: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW with two groups; the decayed one is tagged ``apply_wd`` for the wd schedule."""
    decay: list[nn.Parameter] = []
    plain: list[nn.Parameter] = []
    for name, param in module.named_parameters():
        if param.requires_grad:
            (plain if no_weight_decay(name, param) else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay, "apply_wd": True},
        {"params": plain, "weight_decay": 0.0, "apply_wd": False},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)


def fast_kwargs(params: list[nn.Parameter]) -> dict[str, bool]:
    """AdamW's fused kernel (one launch for every tensor, no host read of the step count) where
    torch has one for these parameters; else the foreach kernels (sharded DTensors, XLA)."""
    plain = all(type(p) is nn.Parameter and p.device.type in ("cpu", "cuda") for p in params)
    return {"fused": True} if plain and params else {"foreach": True}


def dino_layer(name: str, depth: int) -> int:
    """DINOv2's layer id of a student parameter (``param_groups.get_vit_lr_decay_rate``): the
    patch embedding, positions, CLS and mask tokens 0, block ``i`` ``i + 1``, the rest (final
    norm, heads) ``depth + 1``."""
    if name.startswith("backbone."):
        part = name.split(".")[1]
        if part in ("patch_embed", "pos_embed", "cls_token", "mask_token"):
            return 0
        if part == "blocks":
            return int(name.split(".")[2]) + 1
    return depth + 1


def dino_optimizer(module: nn.Module, cfg: DinoOptimConfig, depth: int) -> torch.optim.AdamW:
    """AdamW over the DINO student with DINOv2's per-layer learning rates: each group's
    ``lr_scale`` is ``layer_decay ** (depth + 1 - layer)``, times ``patch_embed_lr_mult`` for the
    patch embedding; ``apply_wd`` as in ``pretrain_optimizer``."""
    groups: dict[tuple[float, bool, bool], list[nn.Parameter]] = {}
    for name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        scale = cfg.layer_decay ** (depth + 1 - dino_layer(name, depth))
        if ".patch_embed." in f".{name}":
            scale *= cfg.patch_embed_lr_mult
        key = (scale, not no_weight_decay(name, param), ".last_layer." in name)
        groups.setdefault(key, []).append(param)
    params = [p for ps in groups.values() for p in ps]
    return torch.optim.AdamW(
        [
            {
                "params": ps,
                "weight_decay": cfg.weight_decay if decay else 0.0,
                "apply_wd": decay,
                "lr_scale": scale,
                "last_layer": last,
            }
            for (scale, decay, last), ps in sorted(groups.items())
        ],
        lr=cfg.lr,
        betas=cfg.betas,
        eps=cfg.eps,
        **fast_kwargs(params),
    )


def set_hyperparameters(
    optimizer: torch.optim.Optimizer, lr: float, weight_decay: float, freeze_last: bool = False
) -> None:
    """Apply this step's scheduled learning rate (times a group's ``lr_scale``; 0 for the
    groups tagged ``last_layer`` while ``freeze_last``: DINOv2's ``last_layer_lr``) and weight
    decay. A zero lr keeps the parameters exactly (AdamW's decay is scaled by the lr too) while
    their moments still accumulate, so a checkpoint of a frozen step resumes like any other."""
    for group in optimizer.param_groups:
        frozen = freeze_last and group.get("last_layer", False)
        group["lr"] = 0.0 if frozen else lr * group.get("lr_scale", 1.0)
        if group.get("apply_wd"):
            group["weight_decay"] = weight_decay


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


def finetune_optimizer(
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


def lr_factors(
    step: int,
    steps_per_epoch: int,
    warmup_steps: int,
    total_steps: int,
    cfg: FinetuneScheduleConfig,
) -> tuple[float, float]:
    """(head, encoder) multipliers of the peak learning rates at optimizer ``step``.

    Linear warmup from ``1 / warmup_steps`` then cosine to ``min_lr_ratio``, clamped at the end.
    An encoder that thaws late warms up again from its unfreeze step, so its first updates
    do not hit pretrained weights at the full rate.
    """
    warm = max(warmup_steps, 1)
    factor = warmup_cosine(  # its warmup's step 0 is already 1 / warmup_steps of the way
        step,
        peak=1.0,
        warmup_steps=warmup_steps,
        total_steps=total_steps,
        start=0.0,
        final=cfg.min_lr_ratio,
    )
    encoder = factor
    if cfg.unfreeze_epoch:
        since = step - cfg.unfreeze_epoch * steps_per_epoch
        encoder = factor * min(1.0, max(0, since + 1) / warm)
    return factor, encoder
