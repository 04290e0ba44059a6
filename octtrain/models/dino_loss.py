"""The DINOv2 losses, pure tensor functions (no I/O, no process group).

* ``dino_loss``: cross-entropy between the teacher's centred, sharpened softmax over the
  prototypes (``teacher_probs``) and the student's softmax at ``student_temp``, over every
  (student crop, teacher crop) pair except a global crop with itself;
* ``ibot_loss``: the same cross-entropy on masked patch tokens, each image's masked tokens
  weighted ``1 / n_masked`` and the sum divided by the number of images (DINOv2's weighting);
* ``koleo_loss``: the Kozachenko-Leonenko entropy estimate on L2-normalised CLS features,
  ``-mean(log d_nn)``, which spreads the batch over the sphere;
* ``teacher_probs`` / ``update_center``: centring (the EMA of the teacher's mean logits) and
  sharpening (a low teacher temperature), which together keep DINO from collapsing;
* ``sinkhorn_knopp``: DINOv2's other teacher (its training configs' choice): the sharpened
  softmax rescaled so each prototype gets an equal share of the (global) batch, which forbids
  the whole batch sitting on a few prototypes however fast the teacher moves;
* ``objective``: the step's whole loss from the student's and teacher's outputs, with what the
  step keeps of it (the targets the alarm reads, this process's sums for the centres): one
  function, so ``torch.compile`` fuses its passes over the ``[M, 65,536]`` logits (on an H100
  they were a third of the compiled step run eagerly: ``bench/bench_dino_step.py``).

Reference: facebookresearch/dinov2 ``dinov2/loss/{dino_clstoken,ibot_patch,koleo}_loss.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F


def teacher_probs(
    logits: torch.Tensor, center: torch.Tensor, temp: float | torch.Tensor
) -> torch.Tensor:
    """Centred, sharpened teacher distribution ``softmax((logits - center) / temp)``."""
    return F.softmax((logits.float() - center) / temp, dim=-1)


def sinkhorn_knopp(
    logits: torch.Tensor,
    temp: float | torch.Tensor,
    iterations: int = 3,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Teacher targets ``[N, K]`` with equal prototype shares over the batch (DINOv2's
    ``sinkhorn_knopp_teacher``); ``reduce_sum`` sums a tensor over replicas (None: one);
    ``valid [N]`` (None: every row) leaves padding rows out of the shares (their rows are 0)."""
    total = reduce_sum or (lambda t: t)
    # The heads' logits are cosines (|l| <= 1): exp(l / temp) stays finite for temp >= 0.012.
    q = torch.exp(logits.float() / temp).t()  # [K, N]
    if valid is None:
        n = total(q.new_full((1,), float(q.shape[1])))  # a fill, not a host-to-device copy
    else:
        q = q * valid.float()[None, :]
        n = total(valid.float().sum().reshape(1))
    k = q.shape[0]
    q = q / total(q.sum().reshape(1)).clamp_min(1e-30)
    for _ in range(iterations):
        q = q / total(q.sum(dim=1, keepdim=True)).clamp_min(1e-30) / k  # each prototype: 1/K
        q = q / q.sum(dim=0, keepdim=True).clamp_min(1e-30) / n  # each row: 1/N
    return (q * n).t()


def update_center(center: torch.Tensor, batch_mean: torch.Tensor, momentum: float) -> torch.Tensor:
    """EMA of the teacher's mean logits (``batch_mean`` already averaged over replicas)."""
    return center * momentum + batch_mean.float() * (1.0 - momentum)


def dino_loss(
    student_logits: list[torch.Tensor], teacher_probs_: list[torch.Tensor], student_temp: float
) -> torch.Tensor:
    """Mean over (student crop s, teacher crop t) pairs, s != t, of the batch-mean
    cross-entropy; the student's first crops are the teacher's crops, in the same order."""
    total = student_logits[0].new_zeros((), dtype=torch.float32)
    terms = 0
    for s, logits in enumerate(student_logits):
        log_p = F.log_softmax(logits.float() / student_temp, dim=-1)
        for t, probs in enumerate(teacher_probs_):
            if s == t:
                continue
            total = total - (probs * log_p).sum(dim=-1).mean()
            terms += 1
    return total / max(terms, 1)


def ibot_loss(
    student_logits: torch.Tensor,
    teacher_probs_: torch.Tensor,
    weights: torch.Tensor,
    images: int,
    student_temp: float,
) -> torch.Tensor:
    """iBOT on the masked tokens ``[M, K]``, token ``m`` weighted ``weights[m]`` (``1 / masked
    tokens of its image``, 0 on padding: ``data/ibot_masks.mask_index``), summed and divided by
    the ``images`` (global crops), those without masked tokens included."""
    log_p = F.log_softmax(student_logits.float() / student_temp, dim=-1)
    per_token = -(teacher_probs_ * log_p).sum(dim=-1)
    return (per_token * weights).sum() / images


def koleo_loss(features: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``-mean_i log ||x_i - x_nn(i)||`` over L2-normalised rows (rows >= 2)."""
    x = F.normalize(features.float(), dim=-1, eps=eps)
    with torch.no_grad():
        dots = x @ x.T
        dots.fill_diagonal_(-2.0)  # never one's own neighbour
        nearest = dots.argmax(dim=1)
    distances = F.pairwise_distance(x, x[nearest], p=2, eps=eps)
    return -torch.log(distances + eps).mean()


# (teacher logits, centre, temperature, valid rows or None) -> the teacher's targets
Targets = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def centred_targets(
    logits: torch.Tensor, center: torch.Tensor, temp: torch.Tensor, valid: torch.Tensor | None
) -> torch.Tensor:
    """``teacher_probs`` as a ``Targets`` (padding rows need no special case: their loss
    weight is 0 and the centre's sums leave them out)."""
    return teacher_probs(logits, center, temp)


class Objective(NamedTuple):
    """One step's loss and what the step keeps of it."""

    loss: torch.Tensor  # the weighted sum, what backward() starts from
    parts: dict[str, torch.Tensor]  # dino, ibot, koleo, unweighted
    probs: torch.Tensor  # the teacher's DINO targets [2B, K] (the blind-targets alarm)
    dino_mean: torch.Tensor  # this process's mean teacher DINO logits [K] (the centre)
    ibot_total: torch.Tensor  # [K_ibot + 1]: the masked tokens' summed teacher logits, count


def objective(
    student: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    teacher: tuple[torch.Tensor, torch.Tensor],
    centers: tuple[torch.Tensor, torch.Tensor],
    temp: torch.Tensor,
    mask_weight: torch.Tensor,
    images: int,
    student_temp: float,
    weights: tuple[float, float, float],
    targets: Targets = centred_targets,
) -> Objective:
    """DINO + iBOT + KoLeo weighted by ``weights`` (in that order). ``student``: global logits
    ``[2B, K]``, local logits ``[LB, K]``, global CLS ``[2B, D]``, masked-token logits
    ``[M, K_ibot]``; ``teacher``: its global and masked-token logits; ``temp`` a device scalar
    (a Python float would recompile a compiled objective at every step of its warm-up);
    ``mask_weight [M]`` 0 on the index list's padding; ``images`` the global crops."""
    s_global, s_local, s_cls, s_masked = student
    t_global, t_masked = teacher
    valid = mask_weight > 0
    probs = targets(t_global, centers[0], temp, None)
    crops = list(s_global.chunk(2))
    n_local = s_local.shape[0] // max(1, s_global.shape[0] // 2)
    if n_local:
        crops += list(s_local.chunk(n_local))
    parts = {
        "dino": dino_loss(crops, list(probs.chunk(2)), student_temp),
        "ibot": ibot_loss(
            s_masked, targets(t_masked, centers[1], temp, valid), mask_weight, images, student_temp
        ),
        "koleo": sum(
            (koleo_loss(c) for c in s_cls.chunk(2)), start=s_cls.new_zeros((), dtype=torch.float32)
        ),
    }
    loss = weights[0] * parts["dino"] + weights[1] * parts["ibot"] + weights[2] * parts["koleo"]
    keep = valid.float()
    ibot_total = torch.cat([(t_masked.float() * keep[:, None]).sum(dim=0), keep.sum().reshape(1)])
    return Objective(loss, parts, probs, t_global.float().mean(dim=0), ibot_total)
