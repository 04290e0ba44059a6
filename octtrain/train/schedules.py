"""Pure schedules of the step: learning rate, EMA momentum, weight decay, teacher temperature.

Each is a plain function of the step, so resuming needs only the step number and the curves can
be tested without a model. Progress is clamped to [0, 1]: past the end a schedule stays at its
final value (V-JEPA's formula climbs again after the end, a cosine restart nobody asked for).
"""

from __future__ import annotations

import math

from octtrain.config.pretrain import OptimConfig, ScheduleConfig


def _progress(step: int, start: int, end: int) -> float:
    if end <= start:
        return 1.0
    return min(1.0, max(0.0, (step - start) / (end - start)))


def warmup_cosine(
    step: int, *, peak: float, warmup_steps: int, total_steps: int, start: float, final: float
) -> float:
    """Linear from ``start`` to ``peak`` over ``warmup_steps``, then cosine down to ``final``.

    Step ``s`` of the warmup takes ``(s + 1) / warmup_steps`` of the way (its last step reaches
    the peak): never exactly 0 with ``start`` 0, which XLA bakes into the graph as a constant
    (0 and 1 are "special scalars"), so the step after it would compile a second program."""
    if step < warmup_steps:
        return start + (peak - start) * (step + 1) / warmup_steps
    p = _progress(step, warmup_steps, total_steps)
    return final + (peak - final) * 0.5 * (1.0 + math.cos(math.pi * p))


def ema_momentum(step: int, *, total_steps: int, start: float, end: float) -> float:
    """Target-encoder momentum: linear from ``start`` to ``end`` over the run."""
    return start + (end - start) * _progress(step, 0, total_steps)


def ema_cosine(step: int, *, total_steps: int, start: float, end: float) -> float:
    """Teacher momentum on a cosine from ``start`` to ``end`` over the run (DINOv2's
    ``momentum_schedule``: 0.992 -> 1): slow to rise early, when the student changes fastest."""
    p = _progress(step, 0, total_steps)
    return end - (end - start) * 0.5 * (1.0 + math.cos(math.pi * p))


def teacher_temperature(step: int, *, warmup_steps: int, start: float, end: float) -> float:
    """DINO's teacher temperature: linear from ``start`` to ``end`` over ``warmup_steps`` (sharp
    targets early, DINOv2: 0.04 -> 0.07 over 30 of 100 epochs), then ``end``."""
    if step >= warmup_steps:
        return end
    return start + (end - start) * step / warmup_steps


def weight_decay(step: int, *, total_steps: int, start: float, end: float) -> float:
    """Cosine from ``start`` to ``end`` over the run (V-JEPA: 0.04 -> 0.4)."""
    p = _progress(step, 0, total_steps)
    return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * p))


def ema_pretraining(
    step: int, optim: OptimConfig, schedule: ScheduleConfig, total_steps: int
) -> dict[str, float]:
    """The per-step values every student/EMA-teacher job logs and applies (V-JEPA, DINOv2):
    learning rate (warmup then cosine), weight decay (cosine) and EMA momentum (V-JEPA's linear
    ramp; DINO replaces it with ``ema_cosine``)."""
    return {
        "train/lr": warmup_cosine(
            step,
            peak=optim.lr,
            warmup_steps=schedule.warmup_steps,
            total_steps=total_steps,
            start=schedule.start_lr,
            final=schedule.final_lr,
        ),
        "train/weight_decay": weight_decay(
            step, total_steps=total_steps, start=optim.weight_decay, end=optim.weight_decay_end
        ),
        "train/ema_momentum": ema_momentum(
            step, total_steps=total_steps, start=schedule.ema_start, end=schedule.ema_end
        ),
    }
