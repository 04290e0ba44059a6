"""The config of ``octtrain pretrain`` with ``job: dino``: DINOv2 on Cell Painting fields.

The shared sections (data, train, validation, logging, checkpoint) and pretraining's optimizer
and schedule (``config/pretrain.py``) are reused as they are; what is DINO's own is the 2D model,
the multi-crop and channel-aware augmentations, and the objective (heads, temperatures,
centring, loss weights, iBOT masks). ``job`` picks this config in ``octtrain pretrain``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from octtrain.config.loader import from_dict, read_values
from octtrain.config.pretrain import OptimConfig, ScheduleConfig
from octtrain.config.sections import (
    ATTENTIONS,
    INPUT_NORMS,
    LEGACY_INPUTS,
    POS_EMBEDS,
    CheckpointConfig,
    DataConfig,
    LoggingConfig,
    TrainConfig,
    ValidationConfig,
    check,
)
from octtrain.errors import ConfigError


@dataclass(frozen=True)
class Vit2dPreset:
    """Encoder sizes and patch of a named 2D ViT."""

    embed_dim: int
    depth: int
    num_heads: int
    patch: int
    # LayerScale's initial value (0: none). DINOv2 (``student.layerscale: 1.0e-05``) for every
    # ViT it trains; not the tiny preset: two blocks have none of the depth it steadies, CaiT's
    # own rule gives shallow stacks 0.1, and the twin bench's figures were measured without it.
    layerscale: float = 0.0


VIT2D_PRESETS: dict[str, Vit2dPreset] = {
    # Tests and CPU smoke runs: a step on 32 x 32 crops takes milliseconds.
    "tiny": Vit2dPreset(embed_dim=48, depth=2, num_heads=3, patch=4),
    "small": Vit2dPreset(embed_dim=96, depth=4, num_heads=4, patch=8, layerscale=1e-5),
    # What the users trained: ViT-S/8 (21.7M parameters), and the cheaper ViT-S/16.
    "vits8": Vit2dPreset(embed_dim=384, depth=12, num_heads=6, patch=8, layerscale=1e-5),
    "vits16": Vit2dPreset(embed_dim=384, depth=12, num_heads=6, patch=16, layerscale=1e-5),
}


CENTERINGS = ("center", "sinkhorn_knopp")
SCALE_UNITS = ("field", "crop")
ANCHORS = ("random", "nucleus")  # where the first global crop of a field is placed
JOBS = ("jepa", "dino")  # what ``octtrain pretrain`` can run; a YAML without ``job`` is jepa
PARALLEL = ("ddp", "fsdp")
COMPILES = ("none", "inductor", "aot_eager")
# The peak lr against the global batch (DINOv2's ``optim.scaling_rule``): ``optim.lr`` is the
# lr at the reference batch (1,024 or 256), scaled by the square root or linearly; none: as set.
SCALING_RULES = ("none", "sqrt_wrt_1024", "linear_wrt_256")
CLIP_SCOPES = ("module", "global")
# DINOv2's shares of the run (30 and 1 of 100 epochs) where a config gives neither share nor steps.
DEFAULT_SHARES = {"warmup_teacher_temp": 0.3, "freeze_last_layer": 0.01}
# What a checkpoint's model section written before an option was trained with.
LEGACY_VIT2D: dict[str, Any] = {"layerscale": 0.0}


@dataclass(frozen=True)
class Vit2dConfig:
    """The 2D ViT: a preset (``tiny``, ``small``, ``vits8``, ``vits16``), sizes overridable.
    ``in_chans`` None: the manifest's channel count."""

    preset: str = "tiny"
    in_chans: int | None = None
    patch: int | None = None
    embed_dim: int | None = None
    depth: int | None = None
    num_heads: int | None = None
    mlp_ratio: float = 4.0
    drop_path: float = 0.0
    attention: str = "auto"
    # The first op and the positions (models/inputs.py, docs/learning-inputs.md): "dataset"
    # standardises each channel with the train split's statistics from the manifest, "sample"
    # each crop by its own (DINO4Cells), "none" the legacy [-1, 1] input; positions "learned"
    # (std 0.02, DINOv2) or "sincos" (the legacy fixed table).
    input_norm: str = "dataset"
    pos_embed: str = "learned"
    # LayerScale's initial value (a learned per-channel gain on each residual branch; 0: none);
    # null: the preset's (1e-5, DINOv2's, but for ``tiny``), set when the DinoConfig is built.
    layerscale: float | None = None

    def __post_init__(self) -> None:
        known = list(VIT2D_PRESETS)
        check(self.preset in VIT2D_PRESETS, f"preset {self.preset!r} unknown (known: {known})")
        for name in ("in_chans", "patch", "embed_dim", "depth", "num_heads"):
            value = getattr(self, name)
            check(value is None or value > 0, f"{name} must be positive or null, got {value}")
        check(self.mlp_ratio > 0, "mlp_ratio must be positive")
        check(0.0 <= self.drop_path < 1.0, "drop_path must be in [0, 1)")
        check(self.attention in ATTENTIONS, f"attention must be one of {ATTENTIONS}")
        check(self.input_norm in INPUT_NORMS, f"input_norm must be one of {INPUT_NORMS}")
        check(self.pos_embed in POS_EMBEDS, f"pos_embed must be one of {POS_EMBEDS}")
        check(self.layerscale is None or self.layerscale >= 0, "layerscale must be >= 0")

    @property
    def patch_size(self) -> int:
        return self.patch or VIT2D_PRESETS[self.preset].patch


@dataclass(frozen=True)
class CropConfig:
    """Multi-crop and channel-aware augmentations, drawn in the loader workers on uint8.

    Each field gives 2 global crops and ``n_local`` local crops: a random region of
    ``scale`` x the field's area (aspect ratio in ``ratio``), read from the cache alone
    (only the chunks it touches), resized to ``global_size`` / ``local_size``, flipped and
    rotated by multiples of 90 degrees (microscopy has no up). Channels are never mixed: each
    channel gets its own gain and shift (applied on the device), and each is dropped (zeroed)
    with probability ``channel_drop``, at least one kept.
    """

    global_size: int = 224
    local_size: int = 96
    n_local: int = 8
    global_scale: tuple[float, float] = (0.32, 1.0)
    local_scale: tuple[float, float] = (0.05, 0.32)
    # What the scales are fractions of: "field" (DINOv2: the whole image's area) or "crop" (the
    # output crop's area: 1.0 reads native pixels, the scale `octtrain profile`'s tiles show).
    scale_unit: str = "field"
    # Local crops drawn inside one of the global crops (centred on it when larger), alternating
    # between the two: on a large field, field-wide local crops at native scale almost never
    # fall inside a global crop, and the local-to-global pairs then compare unrelated cells.
    local_in_global: bool = True
    # The second global crop inside a window this many times the first's side, centred on it
    # (0: anywhere in the field, DINOv2's rule, where the field is one photo's object). Two
    # native-scale crops of a large field otherwise show different cells: views that share only
    # what every crop of the well shares, and DINO's targets for them go uniform.
    global_window: float = 0.0
    # Where the first global crop goes: "random" (anywhere in the field, DINOv2) or "nucleus"
    # (centred, within ``anchor_jitter`` pixels, on one of the field's nuclei drawn at random:
    # DINO4Cells' single-cell views, the views ``octtrain profile`` and ``embed`` describe a
    # field by). A field where the segmentation finds no nucleus gets a random crop. The
    # nuclei are segmented per item from the field's whole first (DNA) channel
    # (``data/nuclei.py``): one more channel read and an Otsu segmentation per item. On the
    # twin's dense fields it lowered DINO's profiles (activity 0.686 -> 0.644,
    # docs/benchmarks.md): for fields where random crops often miss the cells.
    anchor: str = "random"
    anchor_jitter: int = 4
    ratio: tuple[float, float] = (0.75, 1.333)
    flip: float = 0.5
    rot90: bool = True
    channel_drop: float = 0.2
    # Per channel, in the channel's own units (data/cellpainting.to_views): a shift of [-b, b]
    # standard deviations and a gain on the intensity in [1 - c, 1 + c].
    brightness: float = 0.1
    contrast: float = 0.2

    def __post_init__(self) -> None:
        check(self.global_size > 0 and self.local_size > 0, "crop sizes must be positive")
        check(self.n_local >= 0, "n_local must be >= 0")
        for name in ("global_scale", "local_scale", "ratio"):
            lo, hi = getattr(self, name)
            check(0 < lo <= hi, f"{name} must be 0 < low <= high")
        check(
            self.global_window == 0 or self.global_window >= 1,
            "global_window must be 0 (anywhere in the field) or >= 1 (crop sides)",
        )
        check(self.scale_unit in SCALE_UNITS, f"scale_unit must be one of {SCALE_UNITS}")
        check(self.anchor in ANCHORS, f"anchor must be one of {ANCHORS}, got {self.anchor!r}")
        check(self.anchor_jitter >= 0, f"anchor_jitter must be >= 0, got {self.anchor_jitter}")
        if self.scale_unit == "field":
            check(self.global_scale[1] <= 1 and self.local_scale[1] <= 1, "scales must be <= 1")
        check(0.0 <= self.flip <= 1.0, "flip must be a probability")
        check(0.0 <= self.channel_drop < 1.0, "channel_drop must be in [0, 1)")
        check(self.brightness >= 0 and 0 <= self.contrast < 1, "brightness/contrast out of range")


@dataclass(frozen=True)
class DinoObjectiveConfig:
    """DINO + iBOT + KoLeo (DINOv2's defaults, sized down where CPU tests need it)."""

    dino_prototypes: int = 65536
    ibot_prototypes: int = 65536
    head_hidden: int = 2048
    head_bottleneck: int = 256
    head_layers: int = 3
    separate_ibot_head: bool = True
    dino_weight: float = 1.0
    ibot_weight: float = 1.0
    koleo_weight: float = 0.1
    student_temp: float = 0.1
    teacher_temp: float = 0.07
    warmup_teacher_temp: float = 0.04
    # Linear from warmup_teacher_temp to teacher_temp over a share of the run (DINOv2: 30 of
    # 100 epochs) or a number of steps: one of the two (neither: the share 0.3, set when the
    # DinoConfig is built).
    warmup_teacher_temp_share: float | None = None
    warmup_teacher_temp_steps: int | None = None
    center_momentum: float = 0.9
    centering: str = "center"  # the teacher: "center" (EMA centring) or "sinkhorn_knopp"
    mask_probability: float = 0.5  # share of global crops that get iBOT masks
    mask_ratio: tuple[float, float] = (0.1, 0.5)  # share of a masked crop's patches
    # The prototypes (the heads' last layers) stay fixed for a share of the run (DINOv2: its
    # first epoch of 100) or a number of steps: one of the two (neither: the share 0.01).
    freeze_last_layer_share: float | None = None
    freeze_last_layer_steps: int | None = None

    def __post_init__(self) -> None:
        for name in ("dino_prototypes", "ibot_prototypes", "head_hidden", "head_bottleneck"):
            check(getattr(self, name) > 0, f"{name} must be positive")
        check(self.head_layers >= 1, "head_layers must be >= 1")
        for name in ("dino_weight", "ibot_weight", "koleo_weight"):
            check(getattr(self, name) >= 0, f"{name} must be >= 0")
        for name in ("student_temp", "teacher_temp", "warmup_teacher_temp"):
            check(getattr(self, name) > 0, f"{name} must be positive")
        for name in DEFAULT_SHARES:
            share, steps = getattr(self, f"{name}_share"), getattr(self, f"{name}_steps")
            check(
                share is None or steps is None,
                f"{name}_share {share} and {name}_steps {steps} are both set: give one (set "
                "the other to null)",
            )
            check(share is None or 0 <= share <= 1, f"{name}_share must be in [0, 1]")
            check(steps is None or steps >= 0, f"{name}_steps must be >= 0")
        check(0.0 <= self.center_momentum < 1.0, "center_momentum must be in [0, 1)")
        check(self.centering in CENTERINGS, f"centering must be one of {CENTERINGS}")
        check(0.0 <= self.mask_probability <= 1.0, "mask_probability must be a probability")
        lo, hi = self.mask_ratio
        check(0 <= lo <= hi < 1, "mask_ratio must be 0 <= low <= high < 1")

    def teacher_temp_warmup(self, total_steps: int) -> int:
        """The steps of the teacher temperature's warm-up in a run of ``total_steps``."""
        return _steps(self.warmup_teacher_temp_share, self.warmup_teacher_temp_steps, total_steps)

    def frozen_last_layer(self, total_steps: int) -> int:
        """The steps the prototypes stay fixed in a run of ``total_steps``."""
        return _steps(self.freeze_last_layer_share, self.freeze_last_layer_steps, total_steps)


def _steps(share: float | None, steps: int | None, total_steps: int) -> int:
    """``steps``, or ``share`` of ``total_steps`` rounded (0.01 of 12,000: 120)."""
    return steps if steps is not None else round((share or 0.0) * total_steps)


@dataclass(frozen=True)
class DinoOptimConfig(OptimConfig):
    """Pretraining's AdamW plus DINOv2's per-layer learning rates: block ``i`` of ``L`` at
    ``layer_decay ** (L - i)`` of the lr, the patch embedding, CLS and mask tokens at
    ``layer_decay ** (L + 1)`` times ``patch_embed_lr_mult``, the final norm and heads at 1."""

    layer_decay: float = 0.9
    patch_embed_lr_mult: float = 0.2
    # ``lr`` against the global batch (``data.batch_size``, every process's share together):
    # none (lr as set), sqrt_wrt_1024 (DINOv2: lr * sqrt(batch / 1024)), linear_wrt_256.
    scaling_rule: str = "none"
    # grad_clip per module (DINOv2: backbone, DINO head and iBOT head each clipped to
    # clip_grad 3.0) or over the whole student at once.
    grad_clip_scope: str = "module"

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0 < self.layer_decay <= 1, "optim.layer_decay must be in (0, 1]")
        check(self.patch_embed_lr_mult > 0, "optim.patch_embed_lr_mult must be positive")
        check(self.scaling_rule in SCALING_RULES, f"scaling_rule must be one of {SCALING_RULES}")
        check(self.grad_clip_scope in CLIP_SCOPES, f"grad_clip_scope must be one of {CLIP_SCOPES}")

    def peak_lr(self, global_batch: int) -> float:
        """The peak lr at ``global_batch`` samples a step under ``scaling_rule``."""
        if self.scaling_rule == "sqrt_wrt_1024":
            return self.lr * math.sqrt(global_batch / 1024)
        if self.scaling_rule == "linear_wrt_256":
            return self.lr * global_batch / 256
        return self.lr


@dataclass(frozen=True)
class DinoConfig:
    """Everything ``octtrain pretrain`` needs for DINOv2 on Cell Painting (``job: dino``)."""

    job: str = "dino"
    model: Vit2dConfig = field(default_factory=Vit2dConfig)
    data: DataConfig = field(default_factory=DataConfig)
    crops: CropConfig = field(default_factory=CropConfig)
    dino: DinoObjectiveConfig = field(default_factory=DinoObjectiveConfig)
    optim: DinoOptimConfig = field(
        default_factory=lambda: DinoOptimConfig(lr=5e-4, betas=(0.9, 0.999), grad_clip=3.0)
    )
    schedule: ScheduleConfig = field(
        default_factory=lambda: ScheduleConfig(ema_start=0.992, ema_end=0.9999)
    )
    train: TrainConfig = field(default_factory=lambda: TrainConfig(max_steps=1000))
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    parallel: str = "ddp"  # across processes: ddp, or fsdp (sharded student and teacher)
    # torch.compile the student's and the teacher's forwards and (with centring) the objective:
    # "none", "inductor" (the GPU's choice: fused kernels; on an H100 the ViT-S/8 step took
    # 0.184 s against 0.326 s eager, bench/bench_dino_step.py) or "aot_eager" (traced, not
    # code-generated: checks on a CPU).
    compile: str = "none"

    def __post_init__(self) -> None:
        check(self.job == "dino", f"job must be 'dino' for this config, got {self.job!r}")
        if self.train.name is None:
            object.__setattr__(self, "train", dataclasses.replace(self.train, name="dino"))
        # Defaults that depend on another key, set here (a section's own __post_init__ would
        # fix them before the YAML's preset or steps arrive).
        if self.model.layerscale is None:
            scale = VIT2D_PRESETS[self.model.preset].layerscale
            object.__setattr__(self, "model", dataclasses.replace(self.model, layerscale=scale))
        d = self.dino
        for name, share in DEFAULT_SHARES.items():
            if getattr(d, f"{name}_share") is None and getattr(d, f"{name}_steps") is None:
                fill: dict[str, Any] = {f"{name}_share": share}
                d = dataclasses.replace(d, **fill)
        object.__setattr__(self, "dino", d)
        check(self.train.max_steps is not None, "train.max_steps must be set for pretraining")
        check(self.train.epochs is None, "train.epochs is for finetuning; use train.max_steps")
        check(not self.data.balanced_sampling, "data.balanced_sampling is for finetuning only")
        check(self.parallel in PARALLEL, f"parallel must be one of {PARALLEL}")
        check(self.compile in COMPILES, f"compile must be one of {COMPILES}")
        # Per-crop standardisation removes a per-channel gain and shift of a crop (all but the
        # variance floor's trace in a nearly flat channel): a jitter set but unable to act is
        # refused, not run silently.
        check(
            self.model.input_norm != "sample"
            or (self.crops.contrast, self.crops.brightness) == (0, 0),
            f"crops.contrast {self.crops.contrast} and crops.brightness {self.crops.brightness} "
            "have (almost) no effect with model.input_norm: sample (each crop's channels are "
            "z-scored, which removes a per-channel gain and shift): set both to 0",
        )
        p = self.model.patch_size
        for name in ("global_size", "local_size"):
            size = getattr(self.crops, name)
            check(size % p == 0, f"crops.{name} {size} is not divisible by model patch {p}")

    @property
    def max_steps(self) -> int:
        assert self.train.max_steps is not None
        return self.train.max_steps


def job_of(yaml_path: str | os.PathLike[str] | None, overrides: list[str]) -> str:
    """The ``job`` a pretraining config asks for (``jepa`` when it names none)."""
    job = read_values(yaml_path, overrides).get("job", "jepa")
    if job not in JOBS:
        where = f"{yaml_path}: " if yaml_path is not None else ""
        raise ConfigError(f"{where}job {job!r} unknown (known: {list(JOBS)})")
    return str(job)


def checkpoint_config(saved: Mapping[str, Any]) -> DinoConfig:
    """A DINO checkpoint's saved config as this version builds it: the model options it
    predates set to what it was trained with (the input rule, no LayerScale), the rest filled
    and resolved as any config is (a checkpoint's weights then fit the model it describes)."""
    data = dict(saved)
    data["model"] = {**LEGACY_INPUTS, **LEGACY_VIT2D, **data.get("model", {})}
    return from_dict(DinoConfig, data)


def layerscale_hint(diff: Mapping[str, Any]) -> str:
    """What to do when a checkpoint's model config differs from the run's in LayerScale."""
    if "layerscale" not in diff:
        return ""
    return (
        ". A checkpoint written before LayerScale (or without it) has model.layerscale 0: set "
        "model.layerscale=0 to resume it, or start a new run"
    )
