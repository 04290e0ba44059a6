"""Typed, validated run settings and the YAML + dotted-override loader.

Every section is a frozen dataclass that checks itself when built, so a bad value fails before
any work starts. A run config composes sections (``PretrainConfig``); a finetune config reuses the
same sections. ``load_config(PretrainConfig, "configs/pretrain/tiny.yaml", ["train.max_steps=20"])``
reads the YAML, applies overrides (values parsed with ``yaml.safe_load``) and converts every value
to its annotated type; an unknown key raises ``ConfigError`` naming the dotted key.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from octtrain.errors import ConfigError

T = TypeVar("T")

WANDB_MODES = ("online", "offline", "disabled")
DEVICES = ("auto", "cpu", "cuda", "xla")
PRECISIONS = ("auto", "bf16", "fp32")
LOSSES = ("l1", "mse")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _positive(name: str, values: tuple[int, ...], n: int = 3) -> None:
    _check(len(values) == n and all(v > 0 for v in values), f"{name} must be {n} positive ints")


@dataclass(frozen=True)
class ModelConfig:
    """The 3D ViT encoder and predictor: a named preset, optionally with some sizes overridden.

    ``input_shape`` (D, H, W) is what the model sees after cropping; None means the cache's
    volume shape, resolved from the manifest when the run starts.
    """

    preset: str = "tiny"
    input_shape: tuple[int, int, int] | None = None
    patch: tuple[int, int, int] = (4, 16, 16)
    embed_dim: int | None = None
    depth: int | None = None
    num_heads: int | None = None
    pred_dim: int | None = None
    pred_depth: int | None = None
    pred_heads: int | None = None
    mlp_ratio: float = 4.0
    drop_path: float = 0.0

    def __post_init__(self) -> None:
        from octtrain.models.vit3d import PRESETS

        _check(self.preset in PRESETS, f"preset {self.preset!r} unknown (known: {list(PRESETS)})")
        _positive("patch", self.patch)
        if self.input_shape is not None:
            _positive("input_shape", self.input_shape)
            bad = [s % p for s, p in zip(self.input_shape, self.patch, strict=True)]
            _check(
                not any(bad),
                f"input_shape {list(self.input_shape)} is not divisible by patch "
                f"{list(self.patch)}; choose a crop or patch size that divides it",
            )
        for name in ("embed_dim", "depth", "num_heads", "pred_dim", "pred_depth", "pred_heads"):
            value = getattr(self, name)
            _check(value is None or value > 0, f"{name} must be positive or null, got {value}")
        _check(self.mlp_ratio > 0, "mlp_ratio must be positive")
        _check(0.0 <= self.drop_path < 1.0, "drop_path must be in [0, 1)")


@dataclass(frozen=True)
class AugmentConfig:
    """Cheap, per-sample augmentations applied in the loader workers (train split only)."""

    random_crop: bool = True  # random crop of input_shape from the volume; centre crop if False
    flip_w: float = 0.5  # probability of a left-right flip (laterality mirror)
    flip_d: float = 0.0  # probability of reversing the B-scan order
    brightness: float = 0.1  # additive shift, uniform in [-b, b] (image range is [-1, 1])
    contrast: float = 0.1  # multiplicative factor, uniform in [1 - c, 1 + c]

    def __post_init__(self) -> None:
        for name in ("flip_w", "flip_d"):
            _check(0.0 <= getattr(self, name) <= 1.0, f"{name} must be a probability")
        _check(self.brightness >= 0 and 0 <= self.contrast < 1, "brightness/contrast out of range")


@dataclass(frozen=True)
class DataConfig:
    """Where the volumes come from and how they are loaded (batch_size is global)."""

    manifest: str | None = None
    cache: str | None = None  # cache root; None means the manifest's folder
    train_split: str = "train"
    val_split: str = "val"
    batch_size: int = 8
    num_workers: int = 2
    prefetch_factor: int = 2
    persistent_workers: bool = True
    pin_memory: bool = False
    max_samples: int | None = None  # use only the first N volumes of each split (fast start)
    augment: AugmentConfig = field(default_factory=AugmentConfig)

    def __post_init__(self) -> None:
        _check(self.batch_size > 0, "batch_size must be positive")
        _check(self.num_workers >= 0, "num_workers must be >= 0")
        _check(self.prefetch_factor > 0, "prefetch_factor must be positive")
        _check(self.max_samples is None or self.max_samples > 0, "max_samples must be positive")


@dataclass(frozen=True)
class MaskConfig:
    """V-JEPA multi-block 3D masks: blocks are drawn until exactly ratio * N patches are masked."""

    ratio: float = 0.75
    spatial_scale: tuple[float, float] = (0.1, 0.3)  # block area as a fraction of H x W patches
    aspect_ratio: tuple[float, float] = (0.75, 1.5)  # block height / width
    depth_scale: tuple[float, float] = (0.5, 1.0)  # block depth as a fraction of D patches

    def __post_init__(self) -> None:
        _check(0.0 < self.ratio < 1.0, "ratio must be in (0, 1)")
        for name in ("spatial_scale", "aspect_ratio", "depth_scale"):
            lo, hi = getattr(self, name)
            _check(0 < lo <= hi, f"{name} must be 0 < low <= high")
        _check(self.spatial_scale[1] <= 1 and self.depth_scale[1] <= 1, "scales must be <= 1")


@dataclass(frozen=True)
class OptimConfig:
    """AdamW (no weight decay on biases and norms) and gradient clipping."""

    lr: float = 1.5e-4  # peak learning rate, reached at the end of warmup
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.04  # start of the weight-decay schedule
    weight_decay_end: float = 0.4
    grad_clip: float = 10.0  # max grad norm; 0 disables clipping (the norm is still logged)
    loss: str = "l1"  # "l1" or "mse", both on layer-normed target features

    def __post_init__(self) -> None:
        _check(self.lr > 0 and self.eps > 0, "lr and eps must be positive")
        _check(all(0 <= b < 1 for b in self.betas), "betas must be in [0, 1)")
        _check(self.weight_decay >= 0 and self.weight_decay_end >= 0, "weight decay must be >= 0")
        _check(self.grad_clip >= 0, "grad_clip must be >= 0")
        _check(self.loss in LOSSES, f"loss must be one of {LOSSES}, got {self.loss!r}")


@dataclass(frozen=True)
class ScheduleConfig:
    """Linear warmup then cosine to ``final_lr`` (progress clamped: no restarts), and EMA."""

    warmup_steps: int = 100
    start_lr: float = 0.0  # learning rate at step 0
    final_lr: float = 1e-6
    total_steps: int | None = None  # length of the cosine; None means train.max_steps
    ema_start: float = 0.998
    ema_end: float = 1.0

    def __post_init__(self) -> None:
        _check(self.warmup_steps >= 0, "warmup_steps must be >= 0")
        _check(self.start_lr >= 0 and self.final_lr >= 0, "start_lr and final_lr must be >= 0")
        _check(self.total_steps is None or self.total_steps > 0, "total_steps must be positive")
        _check(0 <= self.ema_start <= self.ema_end <= 1, "need 0 <= ema_start <= ema_end <= 1")


@dataclass(frozen=True)
class TrainConfig:
    """The loop: length, device, precision, validation cadence, stall watchdog, run folder."""

    max_steps: int = 1000
    seed: int = 0
    device: str = "auto"
    precision: str = "auto"  # auto: bf16 autocast on CUDA (when supported) and XLA, fp32 on CPU
    val_every: int = 0  # steps between validations; 0 disables
    val_batches: int | None = None  # cap on validation batches per process; None = whole split
    stall_timeout_s: float = 300.0  # watchdog: report when no step finished for this long
    cpu_threads: int = 0  # torch intra-op threads on CPU; 0: the cores left after data workers
    output_dir: str = "runs"
    name: str = "pretrain"
    run_dir: str | None = None  # exact run folder; None means <output_dir>/<name>-<timestamp>

    def __post_init__(self) -> None:
        _check(self.max_steps > 0, "max_steps must be positive")
        _check(self.device in DEVICES, f"device must be one of {DEVICES}, got {self.device!r}")
        _check(self.precision in PRECISIONS, f"precision must be one of {PRECISIONS}")
        _check(self.val_every >= 0, "val_every must be >= 0")
        _check(self.val_batches is None or self.val_batches > 0, "val_batches must be positive")
        _check(self.stall_timeout_s > 0, "stall_timeout_s must be positive")
        _check(self.cpu_threads >= 0, "cpu_threads must be >= 0")
        object.__setattr__(self, "run_dir", _none_if_blank(self.run_dir))


@dataclass(frozen=True)
class LoggingConfig:
    """W&B (or nothing), the local JSON-lines log and the console, all fed the same metrics."""

    wandb_mode: str | None = None  # None: $WANDB_MODE, else "offline"
    wandb_project: str = "octtrain"
    wandb_entity: str | None = None
    wandb_group: str | None = None
    log_every: int = 10
    image_every: int = 0  # steps between input/mask images; 0 disables
    console: bool = True

    def __post_init__(self) -> None:
        _check(
            self.wandb_mode is None or self.wandb_mode in WANDB_MODES,
            f"wandb_mode must be one of {WANDB_MODES} or null, got {self.wandb_mode!r}",
        )
        _check(self.log_every > 0, "log_every must be positive")
        _check(self.image_every >= 0, "image_every must be >= 0")

    def resolved_wandb_mode(self) -> str:
        """The config's mode, else $WANDB_MODE, else offline (records locally, syncs later)."""
        mode = self.wandb_mode or os.environ.get("WANDB_MODE") or "offline"
        _check(mode in WANDB_MODES, f"WANDB_MODE must be one of {WANDB_MODES}, got {mode!r}")
        return mode


@dataclass(frozen=True)
class CheckpointConfig:
    """Where and how often to checkpoint; ``dir`` None/empty means <run_dir>/checkpoints."""

    dir: str | None = None  # local folder or gs://bucket/prefix
    every: int = 500  # steps; the last step is always saved
    keep_last: int = 3
    keep_best: bool = True  # also keep the checkpoint with the lowest val/loss
    resume: str | None = None  # None: fresh start; "auto": latest in dir if any; else a file URL

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", _none_if_blank(self.dir))
        object.__setattr__(self, "resume", _none_if_blank(self.resume))
        _check(self.every > 0, "every must be positive")
        _check(self.keep_last > 0, "keep_last must be positive")
        if self.dir is not None and self.dir.startswith("gs://"):
            bucket = self.dir[len("gs://") :].split("/")[0]
            _check(bucket not in ("", "None", "none", "null"), f"dir {self.dir!r} has no bucket")


@dataclass(frozen=True)
class PretrainConfig:
    """Everything ``octtrain pretrain`` needs (V-JEPA pretraining of the 3D ViT)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    mask: MaskConfig = field(default_factory=MaskConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)


def _none_if_blank(value: str | None) -> str | None:
    # YAML "null" is None already; the strings below come from careless overrides and must never
    # become a folder or a bucket named "None".
    if value is None or value.strip() in ("", "None", "none", "null"):
        return None
    return value


# --- building configs from plain data --------------------------------------------------------


def from_dict(cls: type[T], data: dict[str, Any], path: str = "") -> T:
    """Build dataclass ``cls`` from nested plain data, converting values to the annotated types."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path or '<root>'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs = {}
    for key, value in data.items():
        dotted = f"{path}{key}"
        if key not in names:
            raise ConfigError(f"unknown config key {dotted!r} (known here: {sorted(names)})")
        kwargs[key] = _convert(value, hints[key], dotted)
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        if path and not str(exc).startswith(path):
            raise ConfigError(f"{path.rstrip('.')}: {exc}") from None
        raise


def _convert(value: Any, tp: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(value, inner[0], path)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, path + ".")  # type: ignore[arg-type]
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0], path) for v in value)
        if len(value) != len(args):
            raise ConfigError(f"{path}: expected {len(args)} values, got {list(value)}")
        return tuple(_convert(v, a, path) for v, a in zip(value, args, strict=True))
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        # YAML 1.1 reads "1e-3" as a string; accept any numeric spelling.
        try:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{path}: expected a number, got {value!r}") from None
    if tp is str:
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return str(value)
    raise ConfigError(f"{path}: unsupported config type {tp!r}")


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply one ``dotted.key=value`` override to nested plain data (value via yaml.safe_load)."""
    key, sep, raw = override.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {override!r} is not of the form dotted.key=value")
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {override!r}: {part!r} is not a section")
        node = child
    try:
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {override!r}: value is not valid YAML: {exc}") from None


def load_config(cls: type[T], yaml_path: str | os.PathLike[str] | None, overrides: list[str]) -> T:
    """Read ``yaml_path`` (None: defaults only), apply dotted overrides, build and validate."""
    data: dict[str, Any] = {}
    if yaml_path is not None:
        try:
            text = Path(yaml_path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{yaml_path}: cannot read config: {exc.strerror or exc}") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{yaml_path}: not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{yaml_path}: top level must be a mapping")
        data = loaded or {}
    for override in overrides:
        apply_override(data, override)
    try:
        return from_dict(cls, data)
    except ConfigError as exc:
        where = f"{yaml_path}: " if yaml_path is not None else ""
        raise ConfigError(f"{where}{exc}") from None


def to_dict(config: Any) -> dict[str, Any]:
    """Plain, YAML-safe data for a config (tuples become lists); ``from_dict`` inverts it."""
    return _plain(dataclasses.asdict(config))  # type: ignore[no-any-return]


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def to_yaml(config: Any) -> str:
    """The resolved config as YAML, in field order."""
    return yaml.safe_dump(to_dict(config), sort_keys=False)
