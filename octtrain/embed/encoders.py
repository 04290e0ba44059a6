"""The encoder a checkpoint holds, for the data kind it was trained on.

* a DINO checkpoint (``kind: dino``, Cell Painting): its EMA teacher's backbone (``dino_teacher``);
* a V-JEPA pretraining checkpoint (``kind: pretrain``, OCT): its EMA target encoder (V-JEPA's
  evaluation) or its online context encoder; a fine-tuning checkpoint (``kind: finetune``): the
  fine-tuned encoder (``load_encoder``).

``checkpoint_encoder`` gives either as an ``Encoder`` that says which data kind it reads, so a
command can refuse a manifest of the other kind before any work, naming both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from octtrain.config.dino import CropConfig, DinoConfig, checkpoint_config
from octtrain.config.loader import from_dict
from octtrain.config.sections import ModelConfig
from octtrain.errors import CheckpointError, ConfigError
from octtrain.models.classifier import classifier_from_state, encoder_from_state
from octtrain.models.dino import build_student
from octtrain.models.inputs import legacy_model
from octtrain.models.vit2d import ViT2D
from octtrain.runtime import checkpoint as ckpt

ENCODERS = ("target", "context")
# The data kind each checkpoint kind was trained on.
DATA_KINDS = {"dino": "cellpainting", "pretrain": "oct", "finetune": "oct"}


def dino_config(state: dict[str, Any]) -> DinoConfig:
    """A DINO checkpoint's config (an old checkpoint's input rule and its want of LayerScale
    made explicit)."""
    return checkpoint_config(state["config"])


def dino_in_chans(state: dict[str, Any], url: str) -> int:
    """The channels a DINO checkpoint's teacher reads (its patch embedding's input)."""
    weight = state.get("teacher", {}).get("backbone.patch_embed.weight")
    if weight is None or weight.dim() != 4:
        raise CheckpointError(f"{url}: a DINO checkpoint without its teacher's patch embedding")
    return int(weight.shape[1])


def dino_teacher(state: dict[str, Any], url: str) -> tuple[DinoConfig, ViT2D]:
    """(config, the EMA teacher's backbone in eval mode) of a DINO checkpoint."""
    ckpt.require_kind(
        state,
        url,
        ("dino",),
        "pass a checkpoint of `octtrain pretrain --config configs/pretrain/dino-*.yaml` "
        "(its run folder's checkpoints/)",
    )
    cfg = dino_config(state)
    teacher = build_student(cfg, dino_in_chans(state, url))
    try:
        teacher.load_state_dict(state["teacher"])
    except RuntimeError as exc:
        raise CheckpointError(f"{url}: teacher weights do not fit the model: {exc}") from exc
    return cfg, teacher.backbone.eval()


def load_encoder(
    state: dict[str, Any], url: str, which: str
) -> tuple[nn.Module, tuple[int, int, int], int, str]:
    """(encoder, input shape, its attention heads, a name) from a pretraining checkpoint
    (``which``: target or context encoder) or a finetuning one (its encoder, whatever
    ``which`` says)."""
    ckpt.require_kind(
        state,
        url,
        ("pretrain", "finetune"),
        "the OCT probe reads a V-JEPA encoder: pass a checkpoint of `octtrain pretrain` (V-JEPA) "
        "or `octtrain finetune`; a DINO checkpoint is scored by `octtrain profile`",
    )
    if state.get("kind") == "finetune":
        model, _ = classifier_from_state(state)
        cfg = from_dict(ModelConfig, legacy_model(state["config"]["model"]))
        encoder: nn.Module = model.encoder
        name = "finetuned"
    else:
        if which not in ENCODERS:
            raise CheckpointError(f"--encoder must be one of {ENCODERS}, got {which!r}")
        saved = state.get("config", {}).get("model")
        if saved is None:
            raise CheckpointError(f"{url}: not a pretraining checkpoint (no config.model)")
        saved_cfg = from_dict(ModelConfig, legacy_model(saved))
        encoder, cfg, _ = encoder_from_state(state, url, saved_cfg, which)
        name = which
    if cfg.input_shape is None:
        raise CheckpointError(f"{url}: the checkpoint's model config has no input_shape")
    d, h, w = cfg.input_shape
    return encoder, (int(d), int(h), int(w)), cfg.sizes().num_heads, name


@dataclass
class Encoder:
    """A checkpoint's encoder and what reading items for it needs."""

    module: nn.Module
    data_kind: str  # "cellpainting" or "oct"
    name: str  # teacher, target, context, finetuned
    step: int | None  # the step it was saved at (a fine-tuning checkpoint: its epoch)
    config: dict[str, Any]  # the run's config, as saved
    in_chans: int  # Cell Painting: channels read; OCT: 1
    tile: int  # Cell Painting: the tile side; OCT: 0
    input_shape: tuple[int, int, int] | None  # OCT: depth, height, width; Cell Painting: None
    channels: tuple[str, ...] | None  # Cell Painting: names the run trained on, when saved
    crops: CropConfig | None = None  # Cell Painting: the run's crops (the tile is their size)


def checkpoint_encoder(state: dict[str, Any], url: str, which: str) -> Encoder:
    """The encoder of checkpoint ``state`` (read from ``url``); ``which`` picks a pretraining
    checkpoint's encoder (``target`` or ``context``; a DINO one has only its teacher)."""
    kind = state.get("kind")
    if kind not in DATA_KINDS:
        raise CheckpointError(
            f"{url}: not a training checkpoint of octtrain (kind {kind!r}; expected one of "
            f"{sorted(DATA_KINDS)}): embed a step_*.pt of pretrain, finetune or a DINO run"
        )
    schedule = state.get("schedule") or {}
    step = schedule.get("step") if isinstance(schedule, dict) else None
    if kind == "dino":
        if which not in ("teacher", "auto"):
            raise ConfigError(
                f"--encoder {which}: a DINO checkpoint has one encoder to embed with, its EMA "
                "teacher (--encoder teacher, the default)"
            )
        cfg, backbone = dino_teacher(state, url)
        saved = state.get("channels")
        return Encoder(
            backbone,
            "cellpainting",
            "teacher",
            step,
            dict(state["config"]),
            dino_in_chans(state, url),
            cfg.crops.global_size,
            None,
            tuple(saved) if saved else None,
            cfg.crops,
        )
    if kind == "finetune" and which != "auto":
        raise ConfigError(
            f"--encoder {which}: {url} is a fine-tuning checkpoint, which holds one encoder (the "
            "fine-tuned one, embedded by default): leave --encoder out, or pass a pretraining "
            "checkpoint to choose its target or context encoder"
        )
    if which == "teacher":
        raise ConfigError(
            f"--encoder teacher: {url} is a V-JEPA {kind} checkpoint, not a DINO one; use "
            "--encoder target (the EMA encoder, the default) or context"
        )
    encoder, shape, _, name = load_encoder(state, url, "target" if which == "auto" else which)
    if kind == "finetune":
        step = state.get("epoch")
    return Encoder(encoder.eval(), "oct", name, step, dict(state["config"]), 1, 0, shape, None)
