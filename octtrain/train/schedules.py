"""Pure schedules of the step: learning rate, EMA momentum, weight decay.

Each is a plain function of the step, so resuming needs only the step number and the curves can
be tested without a model. Progress is clamped to [0, 1]: past the end a schedule stays at its
final value (V-JEPA's formula climbs again after the end, a cosine restart nobody asked for).
"""

from __future__ import annotations

import math


def _progress(step: int, start: int, end: int) -> float:
    if end <= start:
        return 1.0
    return min(1.0, max(0.0, (step - start) / (end - start)))


def warmup_cosine(
    step: int, *, peak: float, warmup_steps: int, total_steps: int, start: float, final: float
) -> float:
    """Linear from ``start`` to ``peak`` over ``warmup_steps``, then cosine down to ``final``."""
    if step < warmup_steps:
        return start + (peak - start) * step / warmup_steps
    p = _progress(step, warmup_steps, total_steps)
    return final + (peak - final) * 0.5 * (1.0 + math.cos(math.pi * p))


def ema_momentum(step: int, *, total_steps: int, start: float, end: float) -> float:
    """Target-encoder momentum: linear from ``start`` to ``end`` over the run."""
    return start + (end - start) * _progress(step, 0, total_steps)


def weight_decay(step: int, *, total_steps: int, start: float, end: float) -> float:
    """Cosine from ``start`` to ``end`` over the run (V-JEPA: 0.04 -> 0.4)."""
    p = _progress(step, 0, total_steps)
    return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * p))
