"""The config of ``octtrain finetune``: the shared sections plus head, loss, optimizer, schedule.

The model, data, train, validation, logging and checkpoint sections are the ones pretraining uses
(``config/sections.py``), so the encoder architecture is spelled the same way in both and can be
compared with the checkpoint's. The sections below are finetuning's: the head, the loss, the two
learning rates with layer-wise decay, the epoch schedule with the freeze/unfreeze point, and early
stopping.
"""

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
from octtrain.eval.common.metrics import SCALAR_METRICS

HEAD_KINDS = ("linear", "mlp", "attentive")
HEAD_NORMS = ("layer", "batch", "none")
POOLINGS = ("mean", "cls", "attentive")
CLASS_WEIGHTS = ("none", "auto", "manual")
INIT_ENCODERS = ("target", "context", "random")


@dataclass(frozen=True)
class HeadConfig:
    """The classifier on top of the encoder tokens (see octtrain/models/heads.py)."""

    kind: str = "linear"  # linear | mlp | attentive (attentive probe: needs pooling attentive)
    pooling: str = "mean"  # mean | cls | attentive
    # Normalisation of the pooled features: layer (LayerNorm), batch (BatchNorm without affine,
    # MAE's linear-probe recipe: standardises each feature across samples, which a probe on
    # features with a large shared component needs), or none.
    norm: str = "layer"
    hidden_dim: int = 256  # mlp only
    dropout: float = 0.0
    num_heads: int = 4  # attentive pooling
    num_queries: int = 1  # attentive pooling

    def __post_init__(self) -> None:
        check(self.kind in HEAD_KINDS, f"kind must be one of {HEAD_KINDS}, got {self.kind!r}")
        check(self.pooling in POOLINGS, f"pooling must be one of {POOLINGS}")
        check(self.norm in HEAD_NORMS, f"norm must be one of {HEAD_NORMS}, got {self.norm!r}")
        check(
            self.kind != "attentive" or self.pooling == "attentive",
            "kind=attentive (the attentive probe) needs pooling=attentive",
        )
        check(self.hidden_dim > 0, "hidden_dim must be positive")
        check(0.0 <= self.dropout < 1.0, "dropout must be in [0, 1)")
        check(self.num_heads > 0 and self.num_queries > 0, "num_heads/num_queries must be > 0")


@dataclass(frozen=True)
class LossConfig:
    """Weighted, smoothed cross-entropy.

    ``class_weights``: ``none``; ``auto`` (inverse training-split frequency, ``n / (C * n_c)``,
    printed at start); ``manual`` (``class_weight_values``, one per class in manifest order).
    """

    class_weights: str = "auto"
    class_weight_values: tuple[float, ...] = ()
    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        check(self.class_weights in CLASS_WEIGHTS, f"class_weights must be one of {CLASS_WEIGHTS}")
        manual = self.class_weights == "manual"
        check(
            manual == bool(self.class_weight_values),
            "class_weight_values must be given exactly when class_weights=manual",
        )
        check(all(w >= 0 for w in self.class_weight_values), "class weights must be >= 0")
        check(0.0 <= self.label_smoothing < 1.0, "label_smoothing must be in [0, 1)")


@dataclass(frozen=True)
class FinetuneOptimConfig:
    """AdamW with separate head and encoder learning rates, layer-wise decay, accumulation.

    Encoder block ``i`` of ``depth`` gets ``encoder_lr * layer_decay ** (depth - i)``; the patch
    embedding gets ``layer_decay ** (depth + 1)``. ``effective_batch_size`` (None: no
    accumulation) must be a multiple of ``data.batch_size`` (the global batch per step).
    """

    head_lr: float = 1e-3
    encoder_lr: float = 1e-4
    layer_decay: float = 0.65
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0 disables clipping
    effective_batch_size: int | None = None

    def __post_init__(self) -> None:
        check(self.head_lr > 0 and self.encoder_lr > 0, "head_lr and encoder_lr must be > 0")
        check(0.0 < self.layer_decay <= 1.0, "layer_decay must be in (0, 1]")
        check(self.weight_decay >= 0 and self.eps > 0, "weight_decay >= 0 and eps > 0")
        check(all(0 <= b < 1 for b in self.betas), "betas must be in [0, 1)")
        check(self.grad_clip >= 0, "grad_clip must be >= 0")
        check(
            self.effective_batch_size is None or self.effective_batch_size > 0,
            "effective_batch_size must be positive or null",
        )


@dataclass(frozen=True)
class FinetuneScheduleConfig:
    """Learning-rate warmup and cosine over epochs, and when the encoder thaws."""

    warmup_epochs: float = 2.0  # linear warmup, then cosine to min_lr_ratio (clamped)
    min_lr_ratio: float = 0.01
    unfreeze_epoch: int | None = 0  # encoder frozen before this epoch; 0: never; null: always

    def __post_init__(self) -> None:
        check(self.warmup_epochs >= 0, "warmup_epochs must be >= 0")
        check(0.0 <= self.min_lr_ratio <= 1.0, "min_lr_ratio must be in [0, 1]")
        check(
            self.unfreeze_epoch is None or self.unfreeze_epoch >= 0,
            "unfreeze_epoch must be >= 0 or null",
        )


@dataclass(frozen=True)
class EarlyStoppingConfig:
    """Stop when ``metric`` (validation, higher is better) has not improved by ``min_delta``
    for ``patience`` validations; the best checkpoint is kept by the same metric."""

    metric: str = "balanced_accuracy"
    patience: int = 10  # 0 disables early stopping (the best checkpoint is still kept)
    min_delta: float = 0.0

    def __post_init__(self) -> None:
        check(self.metric in SCALAR_METRICS, f"metric must be one of {SCALAR_METRICS}")
        check(self.patience >= 0 and self.min_delta >= 0, "patience and min_delta must be >= 0")


@dataclass(frozen=True)
class FinetuneConfig:
    """Everything ``octtrain finetune`` needs."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    acquisition: AcquisitionConfig = field(default_factory=AcquisitionConfig)  # training split
    head: HeadConfig = field(default_factory=HeadConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: FinetuneOptimConfig = field(default_factory=FinetuneOptimConfig)
    schedule: FinetuneScheduleConfig = field(default_factory=FinetuneScheduleConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(epochs=30))
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    validation: ValidationConfig = field(default_factory=lambda: ValidationConfig(every=1))
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(
        default_factory=lambda: CheckpointConfig(every=1, keep_last=1)
    )
    init_encoder: str = "target"  # target (the EMA encoder, V-JEPA's choice) | context | random

    def __post_init__(self) -> None:
        if self.train.name is None:
            object.__setattr__(self, "train", dataclasses.replace(self.train, name="finetune"))
        epochs = self.train.epochs
        check(epochs is not None, "train.epochs must be set for finetuning")
        check(self.train.max_steps is None, "train.max_steps is for pretraining; use train.epochs")
        assert epochs is not None
        check(self.schedule.warmup_epochs <= epochs, "schedule.warmup_epochs exceeds train.epochs")
        check(self.init_encoder in INIT_ENCODERS, f"init_encoder must be one of {INIT_ENCODERS}")
        check(
            not self.acquisition.two_looks,
            "acquisition.two_looks is for pretraining (the target encoder's view); unset it here",
        )
        eff = self.optim.effective_batch_size
        check(
            eff is None or eff % self.data.batch_size == 0,
            f"optim.effective_batch_size {eff} is not a multiple of data.batch_size "
            f"{self.data.batch_size}",
        )

    @property
    def epochs(self) -> int:
        assert self.train.epochs is not None
        return self.train.epochs

    @property
    def accum_steps(self) -> int:
        """Micro-batches per optimizer step."""
        eff = self.optim.effective_batch_size
        return 1 if eff is None else eff // self.data.batch_size
