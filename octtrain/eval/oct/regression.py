"""Regression on a clinical concept (``data.label.task: regression``): metrics and prediction.

The head has one output, trained on the target standardized with the training split's mean and
standard deviation (``Standardizer``, stored in the checkpoint); predictions are mapped back to
the concept's unit before any metric. Metrics: MAE, RMSE and R^2 (1 - SSE/SST over the split;
``nan`` with fewer than two distinct targets), at volume level and, averaging a participant's
volumes, at participant level. Higher is better for early stopping, so its score is ``-MAE``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from octtrain.eval.common.validation import collect
from octtrain.runtime.backend import Backend

TARGET_KEY = "target"  # octtrain.data.dataset.ManifestDataset's item layout


@dataclass(frozen=True)
class Standardizer:
    """target -> (target - mean) / std for the loss; the model's output back to the unit."""

    mean: float
    std: float

    @classmethod
    def fit(cls, targets: Sequence[float]) -> Standardizer:
        values = np.asarray(targets, dtype=np.float64)
        std = float(values.std()) if values.size > 1 else 1.0
        return cls(float(values.mean()) if values.size else 0.0, std if std > 1e-8 else 1.0)

    def forward(self, target: torch.Tensor) -> torch.Tensor:
        return (target - self.mean) / self.std

    def inverse(self, output: torch.Tensor) -> torch.Tensor:
        return output * self.std + self.mean

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class RegressionMetrics:
    """Errors of one split's predictions, in the concept's unit."""

    num_samples: int
    mae: float
    rmse: float
    r2: float
    mean_target: float

    def as_dict(self) -> dict[str, float | int | None]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v)
                for k, v in asdict(self).items()}  # fmt: skip


def regression_metrics(
    predicted: npt.NDArray[np.float64], target: npt.NDArray[np.float64]
) -> RegressionMetrics:
    """MAE, RMSE and R^2 of ``predicted`` against ``target`` (1-D, same length)."""
    n = int(target.size)
    if not n:
        return RegressionMetrics(0, math.nan, math.nan, math.nan, math.nan)
    err = predicted - target
    sst = float(((target - target.mean()) ** 2).sum())
    r2 = 1.0 - float((err**2).sum()) / sst if sst > 0 else math.nan
    return RegressionMetrics(
        n, float(np.abs(err).mean()), float(np.sqrt((err**2).mean())), r2, float(target.mean())
    )


def participant_means(
    pids: Sequence[str], predicted: npt.NDArray[np.float64], target: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Each participant's mean prediction and target, in first-seen order."""
    order = list(dict.fromkeys(pids))
    index = np.array([order.index(p) for p in pids])
    count = np.bincount(index, minlength=len(order)).astype(np.float64)
    return (
        np.bincount(index, predicted, minlength=len(order)) / count,
        np.bincount(index, target, minlength=len(order)) / count,
    )


def predict_values(
    model: nn.Module,
    batches: Iterable[dict[str, Any]],
    backend: Backend,
    n: int,
    scale: Standardizer,
    to_input: Callable[[dict[str, Any]], torch.Tensor],
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Every sample's prediction (in the unit) and target, exactly once across processes."""

    def rows(batch: dict[str, Any]) -> torch.Tensor:
        out = scale.inverse(model(to_input(batch)).float()[:, :1])
        return torch.cat([out, batch[TARGET_KEY].float()[:, None]], dim=1)

    table = collect(rows, batches, backend, n, 2, models=[model])
    return table[:, 0], table[:, 1]


def flat(prefix: str, m: RegressionMetrics) -> dict[str, float]:
    """``{prefix/mae: ..., prefix/rmse: ..., prefix/r2: ...}`` for the tracker."""
    return {f"{prefix}/{k}": float(getattr(m, k)) for k in ("mae", "rmse", "r2")}
