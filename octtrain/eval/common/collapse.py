"""Collapse indicators of representations (pure): per-dimension spread and effective rank, and
the alarm for targets that carry no image (teacher entropies, target spread across samples).

A JEPA that collapses maps every input to (nearly) the same features: the per-dimension standard
deviation falls towards 0 and the effective rank towards 1. Both are computed on host copies of
features, after the step (never inside a traced XLA step).
"""

from __future__ import annotations

import math

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


# --- targets that carry no image (docs/learning-inputs.md) -------------------------------------
# A teacher (DINO) or target encoder (V-JEPA) whose output barely depends on its input gives
# every sample the same target: the student can match it without looking at the image, and the
# loss still falls. Two symptoms, both read on the host one step behind (never a host sync).


def target_entropies(probs: torch.Tensor) -> dict[str, torch.Tensor]:
    """DINO's teacher targets ``probs [crops, K]`` in nats, as device scalars: the mean per-crop
    entropy, the entropy of the batch-mean distribution, their gap and ``log K`` (uniform).
    One prototype for every crop: batch entropy 0. Uniform targets: per-crop entropy ``log K``.
    Either way, when targets do not depend on the crop the gap is 0; healthy training keeps the
    batch entropy high and the per-crop entropy well below it."""
    p = probs.detach().float().clamp_min(1e-12)
    per_crop = -(p * p.log()).sum(dim=-1).mean()
    mean = p.mean(dim=0)
    batch = -(mean * mean.log()).sum()
    log_k = torch.full_like(batch, math.log(p.shape[-1]))
    return {
        "train/teacher_entropy": per_crop,
        "train/teacher_batch_entropy": batch,
        "train/teacher_entropy_gap": batch - per_crop,
        "train/teacher_log_k": log_k,
    }


def sample_spread(tokens: torch.Tensor) -> torch.Tensor:
    """How much features ``[B, N, D]`` (or ``[B, D]``) change from sample to sample: the RMS of
    their std across samples (at each position) over the RMS of their mean across samples.
    0: every sample gets the same features; NaN for fewer than 2 samples (no verdict)."""
    t = tokens.detach().float()
    if t.shape[0] < 2:
        return torch.full((), math.nan, device=t.device)
    spread = t.var(dim=0, correction=0).mean().sqrt()
    level = t.mean(dim=0).square().mean().sqrt()
    return spread / level.clamp_min(1e-12)


def blind_targets_alarm(
    metrics: dict[str, float], entropy_margin: float, min_spread: float
) -> str | None:
    """A message when the metrics show targets that carry no image, else None: the teacher's
    per-crop entropy within ``entropy_margin * log K`` of its batch entropy (and whether also of
    ``log K``: uniform targets), or a target spread across samples below ``min_spread``."""
    per_crop = metrics.get("train/teacher_entropy")
    batch = metrics.get("train/teacher_batch_entropy")
    log_k = metrics.get("train/teacher_log_k")
    if per_crop is not None and batch is not None and log_k is not None:
        margin = entropy_margin * log_k
        if math.isfinite(per_crop) and batch - per_crop < margin:
            kind = (
                "uniform over the prototypes"
                if log_k - per_crop < margin
                else "the same prototypes for every crop"
            )
            return (
                f"the teacher's per-crop entropy {per_crop:.3f} is within "
                f"{margin:.3f} of its batch entropy {batch:.3f} (log K {log_k:.3f}): its targets "
                f"are {kind}, whatever the crop shows"
            )
    for key in ("train/target_spread", "val/target_spread"):
        spread = metrics.get(key)
        if spread is not None and math.isfinite(spread) and spread < min_spread:
            return (
                f"the target encoder's features vary across samples by "
                f"{spread:.4f} of their mean ({key} < {min_spread}): they barely depend on the "
                "input"
            )
    return None
