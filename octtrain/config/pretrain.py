"""The config of ``octtrain pretrain``: the shared sections plus masks, optimizer and schedules."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from octtrain.config.acquisition import AcquisitionConfig
from octtrain.config.sections import (
    CheckpointConfig,
    DataConfig,
    LoggingConfig,
    ModelConfig,
    TrainConfig,
    ValidationConfig,
    check,
)

LOSSES = ("l1", "mse")


@dataclass(frozen=True)
class MaskConfig:
    """V-JEPA masks: blocks drawn until exactly ratio * N patches are masked, from two
    generators (V-JEPA's short-range and long-range blocks), each sample using one of them.

    Blocks are tubes through the whole depth (B-scan) axis by default, as V-JEPA's run through
    the whole temporal axis: a block that covered only some B-scans would leave the same (h, w)
    position visible in a neighbouring B-scan, a copy shortcut (``data/masks.py`` measures it).
    """

    ratio: float = 0.75
    short_scale: tuple[float, float] = (0.1, 0.2)  # short-range block area, fraction of H x W
    long_scale: tuple[float, float] = (0.5, 0.7)  # long-range block area, fraction of H x W
    long_share: float = 0.5  # probability that a sample's mask comes from the long-range one
    aspect_ratio: tuple[float, float] = (0.75, 1.5)  # block height / width
    depth_scale: tuple[float, float] = (1.0, 1.0)  # block depth as a fraction of D patches

    def __post_init__(self) -> None:
        check(0.0 < self.ratio < 1.0, "ratio must be in (0, 1)")
        for name in ("short_scale", "long_scale", "aspect_ratio", "depth_scale"):
            lo, hi = getattr(self, name)
            check(0 < lo <= hi, f"{name} must be 0 < low <= high")
        for name in ("short_scale", "long_scale", "depth_scale"):
            check(getattr(self, name)[1] <= 1, f"{name} must be <= 1")
        check(0.0 <= self.long_share <= 1.0, "long_share must be in [0, 1]")


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
        check(self.lr > 0 and self.eps > 0, "lr and eps must be positive")
        check(all(0 <= b < 1 for b in self.betas), "betas must be in [0, 1)")
        check(self.weight_decay >= 0 and self.weight_decay_end >= 0, "weight decay must be >= 0")
        check(self.grad_clip >= 0, "grad_clip must be >= 0")
        check(self.loss in LOSSES, f"loss must be one of {LOSSES}, got {self.loss!r}")


@dataclass(frozen=True)
class ScheduleConfig:
    """Linear warmup then cosine to ``final_lr`` (progress clamped: no restarts), and EMA."""

    warmup_steps: int = 100
    start_lr: float = 0.0  # learning rate at step 0
    final_lr: float = 1e-6
    total_steps: int | None = None  # length of the cosine; None means train.max_steps
    ema_start: float = 0.998
    ema_end: float = 0.9999  # below 1, so the target never freezes (V-JEPA 2: 0.99925 constant)

    def __post_init__(self) -> None:
        check(self.warmup_steps >= 0, "warmup_steps must be >= 0")
        check(self.start_lr >= 0 and self.final_lr >= 0, "start_lr and final_lr must be >= 0")
        check(self.total_steps is None or self.total_steps > 0, "total_steps must be positive")
        # A cosine that ends before the warmup does would drop from the peak straight to
        # final_lr (and with the clamp removed, stay at the peak): refuse, naming both keys.
        check(
            self.total_steps is None or self.total_steps > self.warmup_steps,
            f"schedule.total_steps ({self.total_steps}) must exceed schedule.warmup_steps "
            f"({self.warmup_steps}): the cosine would have no steps",
        )
        check(
            0 <= self.ema_start <= self.ema_end < 1,
            "need 0 <= ema_start <= ema_end < 1 (at 1 the target stops learning)",
        )

    def short_run(self, max_steps: int) -> str | None:
        """What a run of ``max_steps`` shorter than the warmup gets (said by ``pretrain``), or
        None. Warned, not refused: every smoke run of a real config (``train.max_steps=2``) is
        one, and ``schedule.total_steps`` marks a run that starts a longer schedule."""
        if self.total_steps is not None or self.warmup_steps <= max_steps:
            return None
        share = max_steps / self.warmup_steps
        return (
            f"schedule.warmup_steps ({self.warmup_steps}) exceeds train.max_steps ({max_steps}): "
            f"the learning rate peaks at {share:.0%} of optim.lr in this run and never decays; "
            f"set schedule.warmup_steps to {max_steps} or less for a run of this length, or "
            "schedule.total_steps if it starts a longer schedule"
        )


@dataclass(frozen=True)
class PretrainConfig:
    """Everything ``octtrain pretrain`` needs (V-JEPA pretraining of the 3D ViT)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    acquisition: AcquisitionConfig = field(default_factory=AcquisitionConfig)  # training views
    mask: MaskConfig = field(default_factory=MaskConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(max_steps=1000))
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def __post_init__(self) -> None:
        if self.train.name is None:
            object.__setattr__(self, "train", dataclasses.replace(self.train, name="pretrain"))
        check(self.train.max_steps is not None, "train.max_steps must be set for pretraining")
        check(self.train.epochs is None, "train.epochs is for finetuning; use train.max_steps")
        check(not self.data.balanced_sampling, "data.balanced_sampling is for finetuning only")

    @property
    def max_steps(self) -> int:
        assert self.train.max_steps is not None
        return self.train.max_steps
