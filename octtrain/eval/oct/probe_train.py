"""Probes on frozen tokens: V-JEPA's attentive probe and a linear probe, each fitted over a
small learning-rate grid and chosen on the validation split (torch, no I/O).

* ``attentive``: one learnable query cross-attends to all tokens (one block with an MLP), then
  LayerNorm and a linear layer: V-JEPA's evaluation protocol (octtrain/models/heads.py).
* ``linear``: mean-pooled tokens, standardised per feature (BatchNorm without affine, MAE's
  linear probe), then a linear layer.

For each learning rate a fresh head (seeded) trains with AdamW and a class-weighted loss
(inverse training frequency); after every epoch it is scored on validation. The chosen head is
the (learning rate, epoch) with the best validation balanced accuracy, ties and undefined scores
going to the lower validation loss. Seeded draws only (``torch.Generator``): the same seed gives
the same head on the same machine.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from octtrain.config.finetune import HeadConfig, LossConfig
from octtrain.data.splits import class_weights
from octtrain.errors import ConfigError
from octtrain.eval.common.metrics import balanced_accuracy, confusion_matrix
from octtrain.models.heads import ClassifierHead

PROBES = ("attentive", "linear")


@dataclass(frozen=True)
class ProbeSettings:
    lrs: tuple[float, ...] = (3e-4, 1e-3, 3e-3, 1e-2)
    epochs: int = 30
    batch_size: int = 16
    weight_decay: float = 0.01
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.lrs or any(not lr > 0 for lr in self.lrs):
            raise ConfigError(f"--lrs: every learning rate must be > 0, got {list(self.lrs)}")
        if self.epochs < 1:
            raise ConfigError(f"--epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {self.batch_size}")


@dataclass(frozen=True)
class GridPoint:
    lr: float
    best_epoch: int
    val_balanced_accuracy: float
    val_loss: float


@dataclass
class ProbeFit:
    kind: str
    head: ClassifierHead
    chosen: GridPoint
    grid: list[GridPoint] = field(default_factory=list)


def make_head(kind: str, dim: int, num_classes: int, num_heads: int) -> ClassifierHead:
    if kind == "attentive":
        cfg = HeadConfig(
            kind="attentive", pooling="attentive", norm="layer", num_heads=num_heads, num_queries=1
        )
    elif kind == "linear":
        cfg = HeadConfig(kind="linear", pooling="mean", norm="batch")
    else:
        raise ConfigError(f"unknown probe {kind!r}; choose one of {PROBES}")
    return ClassifierHead(cfg, dim, num_classes, has_cls=False)


def predict_probs(head: nn.Module, tokens: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
    """Softmax probabilities (float64, CPU) of ``head`` on float16 or float32 tokens."""
    head.eval()
    out = []
    with torch.no_grad():
        for chunk in torch.split(tokens, batch_size):
            out.append(torch.softmax(head(chunk.float()), dim=1).double())
    return torch.cat(out) if out else torch.zeros(0, 0, dtype=torch.float64)


def _val_scores(
    head: nn.Module, tokens: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> tuple[float, float]:
    probs = predict_probs(head, tokens)
    loss = float(nn.functional.nll_loss(torch.log(probs.clamp_min(1e-12)), labels))
    cm = confusion_matrix(labels.numpy(), probs.argmax(1).numpy(), num_classes)
    return balanced_accuracy(cm), loss


def _better(a: GridPoint, b: GridPoint | None) -> bool:
    if b is None:
        return True
    key_a = (
        -math.inf if math.isnan(a.val_balanced_accuracy) else a.val_balanced_accuracy,
        -a.val_loss,
    )
    key_b = (
        -math.inf if math.isnan(b.val_balanced_accuracy) else b.val_balanced_accuracy,
        -b.val_loss,
    )
    return key_a > key_b


def fit_probe(
    kind: str,
    train: tuple[torch.Tensor, torch.Tensor],
    val: tuple[torch.Tensor, torch.Tensor],
    num_classes: int,
    num_heads: int,
    settings: ProbeSettings,
) -> ProbeFit:
    """The best head of the grid (by validation), with every grid point's best epoch."""
    x, y = train
    counts: Sequence[int] = np.bincount(y.numpy(), minlength=num_classes).tolist()
    weights = class_weights(LossConfig(class_weights="auto"), counts)
    loss_fn = nn.CrossEntropyLoss(
        weight=None if weights is None else torch.as_tensor(weights, dtype=torch.float32)
    )
    dim = int(x.shape[-1])
    chosen: tuple[GridPoint, dict[str, torch.Tensor]] | None = None
    grid = []
    for lr in settings.lrs:
        torch.manual_seed(settings.seed)
        head = make_head(kind, dim, num_classes, num_heads)
        opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=settings.weight_decay)
        order = torch.Generator().manual_seed(settings.seed)
        best: GridPoint | None = None
        for epoch in range(1, settings.epochs + 1):
            head.train()
            for idx in torch.split(torch.randperm(len(y), generator=order), settings.batch_size):
                if kind == "linear" and len(idx) < 2:
                    continue  # BatchNorm needs two samples; one left over is skipped
                loss = loss_fn(head(x[idx].float()), y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
            bacc, vloss = _val_scores(head, val[0], val[1], num_classes)
            point = GridPoint(lr, epoch, bacc, vloss)
            if _better(point, best):
                best = point
            if chosen is None or _better(point, chosen[0]):
                chosen = (point, copy.deepcopy(head.state_dict()))
        assert best is not None
        grid.append(best)
    assert chosen is not None
    head = make_head(kind, dim, num_classes, num_heads)
    head.load_state_dict(chosen[1])
    head.eval()
    return ProbeFit(kind, head, chosen[0], grid)
