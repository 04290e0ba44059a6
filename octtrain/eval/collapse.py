"""Collapse indicators of representations (pure): per-dimension spread and effective rank.

A JEPA that collapses maps every input to (nearly) the same features: the per-dimension standard
deviation falls towards 0 and the effective rank towards 1. Both are computed on host copies of
features, after the step (never inside a traced XLA step).
"""

from __future__ import annotations

import torch


def feature_std(features: torch.Tensor) -> float:
    """Mean over dimensions of the std across rows of ``features [M, D]`` (after L2 norm)."""
    x = torch.nn.functional.normalize(features.float(), dim=-1)
    return float(x.std(dim=0).mean())


def effective_rank(features: torch.Tensor) -> float:
    """exp(entropy) of the normalised singular values of centred ``features [M, D]`` (Roy &
    Vetterli 2007): 1 for rank-one features, up to min(M, D)."""
    x = features.float()
    s = torch.linalg.svdvals(x - x.mean(dim=0, keepdim=True))
    p = s / s.sum().clamp_min(1e-12)
    entropy = -(p * torch.log(p.clamp_min(1e-12))).sum()
    return float(torch.exp(entropy))


def representation_alarm(erank: float, min_rank: float) -> str | None:
    """A message when features have (nearly) collapsed to one direction, else None."""
    if erank < min_rank:
        return (
            f"representation collapse: feature effective rank {erank:.2f} < {min_rank} "
            "(every input maps to nearly the same features)"
        )
    return None
