"""The learning rate of each RL step: constant, or a linear warm-up then a linear or cosine decay.

A decaying rate lets a run settle: late in GRPO most groups have equal returns and are dropped, so a
step's update rests on the few groups left, and at a constant rate those noisy updates keep moving
the policy until the last step. The decay ends at `lr_final_ratio × learning_rate` on the last step.
"""

from __future__ import annotations

import math
from typing import Literal

LRSchedule = Literal["constant", "linear", "cosine"]


def scheduled_learning_rate(
    base: float,
    step: int,
    total_steps: int,
    *,
    schedule: LRSchedule = "constant",
    warmup_steps: int = 0,
    final_ratio: float = 0.0,
) -> float:
    """The learning rate of step `step` (0-based) of `total_steps`.

    Warm-up: steps 0 … warmup_steps−1 rise linearly to `base` (step k gets base·(k+1)/warmup_steps).
    Then "linear" or "cosine" fall from `base` towards `base·final_ratio`, which the step after the
    last would reach; "constant" stays at `base`.
    """
    if step < warmup_steps:
        return base * (step + 1) / warmup_steps
    if schedule == "constant":
        return base
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    if schedule == "linear":
        shape = 1.0 - progress
    elif schedule == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"unknown learning-rate schedule {schedule!r}; use constant, linear or cosine")
    return base * (final_ratio + (1.0 - final_ratio) * shape)
