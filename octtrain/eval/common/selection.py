"""Model selection: early stopping on a validation metric where higher is better (pure); the
skeleton refuses a validation as best while the targets carry no image (``refuse``)."""

from __future__ import annotations

import math


class EarlyStopping:
    """Tracks the best value; stops after ``patience`` validations without an improvement.

    An improvement must beat the best by more than ``min_delta``; an undefined (NaN) value is
    never one, nor is an infinite one. ``patience`` 0 never stops (the best value is still tracked).
    """

    def __init__(self, patience: int, min_delta: float) -> None:
        self.patience, self.min_delta = patience, min_delta
        self.best = -math.inf
        self.bad = 0

    def update(self, value: float) -> bool:
        """Record one validation's value; True when it is the new best."""
        if math.isfinite(value) and value > self.best + self.min_delta:
            self.best, self.bad = value, 0
            return True
        self.bad += 1
        return False

    def refuse(self) -> None:
        """Record a validation whose checkpoint may not be the best (its targets carry no
        image): it counts against the patience, never as an improvement."""
        self.bad += 1

    @property
    def should_stop(self) -> bool:
        return self.patience > 0 and self.bad >= self.patience
