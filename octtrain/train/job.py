"""What a job gives the training skeleton and what the skeleton gives back.

A ``Job`` (``train/pretrain.py``, ``train/finetune.py``) owns what differs between pretraining
and finetuning; ``Trainer`` (``train/loop.py``) runs it as ``Settings`` say and returns a
``RunResult``. A step returns a ``StepResult`` of device tensors the skeleton reads one step
later; a validation returns an ``Evaluation``. ``monitor_rows`` is what a step hands the
collapse monitor.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from octtrain.config.finetune import FinetuneConfig
from octtrain.config.loader import to_dict, to_yaml
from octtrain.config.pretrain import PretrainConfig
from octtrain.config.sections import (
    CheckpointConfig,
    LoggingConfig,
    TrainConfig,
    ValidationConfig,
)

MONITOR_ROWS = 1024  # feature rows the collapse monitor looks at per logged step


@dataclass
class StepResult:
    """One training step's device tensors (read on the host one step later) and host values."""

    loss: torch.Tensor  # scalar: mean over the step's batch
    grad_norm: torch.Tensor  # before clipping, before zeroing
    features: torch.Tensor | None = None  # [rows, D] from ``monitor_rows``, inside the step
    host: dict[str, float] = field(default_factory=dict)  # lr, weight decay, EMA momentum...
    # Device scalars the skeleton reads one step later, on logged steps and before a validation
    # (teacher entropies, target spread: the alarm for targets that carry no image).
    monitors: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class Evaluation:
    """What a validation found: metrics (logged under ``val/``), the selection score (higher is
    better; None: no selection), and an alarm message when something collapsed."""

    metrics: dict[str, float]
    score: float | None = None
    alarm: str | None = None
    images: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class Settings:
    """The config sections the skeleton reads (shared by every job)."""

    train: TrainConfig
    validation: ValidationConfig
    logging: LoggingConfig
    checkpoint: CheckpointConfig
    config: dict[str, Any]  # the whole resolved config, for the run folder and W&B
    config_yaml: str
    patience: int = 0  # early stopping on the validation score; 0 never stops
    min_delta: float = 0.0

    @classmethod
    def of(
        cls, cfg: PretrainConfig | FinetuneConfig, patience: int = 0, min_delta: float = 0.0
    ) -> Settings:
        """The skeleton's view of a job's config."""
        return cls(
            train=cfg.train,
            validation=cfg.validation,
            logging=cfg.logging,
            checkpoint=cfg.checkpoint,
            config=to_dict(cfg),
            config_yaml=to_yaml(cfg),
            patience=patience,
            min_delta=min_delta,
        )


class Job(Protocol):
    """What differs between pretraining and finetuning."""

    kind: str  # "pretrain" | "finetune" (W&B job type, log lines)
    steps_per_unit: int  # optimizer steps per unit of the run (1, or steps per epoch)
    total_steps: int
    global_batch: int  # samples per optimizer step, all processes together
    validates_last: bool  # validate after the last unit even when validation.every is 0

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore weights, optimizer and the job's own state (before ``start``)."""
        ...

    def state(self, step: int) -> dict[str, Any]:
        """Everything a resume needs; called on every process at each save (process 0 alone
        writes), so copying a sharded tensor runs on every host."""
        ...

    def start(self, start_step: int) -> Iterable[dict[str, Any]]:
        """Wrap the model for the backend; this process's host batches from ``start_step``."""
        ...

    def before_step(self, step: int) -> None:
        """Changes that happen at a step (finetuning thaws the encoder at an epoch start)."""
        ...

    def train_step(self, batch: dict[str, Any], step: int) -> StepResult:
        """One optimizer step on a device batch; static shapes, no host reads."""
        ...

    def end_of_unit(self, unit: int) -> tuple[dict[str, float], str | None]:
        """Metrics of the unit just finished (logged before validation) and an alarm."""
        ...

    def validate(self, unit: int) -> Evaluation:
        """Validation over the whole split, counted once across processes."""
        ...

    def images(self, batch: dict[str, Any], result: StepResult) -> dict[str, np.ndarray]:
        """Pictures of this step (inputs, masks, representations); may be empty."""
        ...


@dataclass
class RunResult:
    run_dir: Path | None
    steps: int  # the last step trained
    last_loss: float | None
    last_checkpoint: str | None
    best_checkpoint: str | None
    best_unit: int | None
    best_score: float | None
    stopped_early: bool
    validation_failures: int
    history: list[dict[str, float]]  # per unit: end-of-unit metrics and validation metrics


def monitor_rows(features: torch.Tensor, rows: int = MONITOR_ROWS) -> torch.Tensor:
    """Up to ``rows`` feature rows of ``[B, N, D]`` features, the same number from every sample
    of the batch (evenly spaced tokens), so the indicators describe the batch and not its first
    volume. Called inside the step, so on XLA the selection is part of the step's graph and the
    host later only copies the result."""
    b, n, d = features.shape
    per_sample = max(1, min(n, rows // max(b, 1)))
    idx = torch.linspace(0, n - 1, per_sample).round().long()
    picked = features.detach()[:, idx.to(features.device)]
    return picked.reshape(-1, d)
