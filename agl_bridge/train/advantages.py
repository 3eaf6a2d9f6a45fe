"""GRPO advantages: each rollout's return minus its group's mean, and the datums that carry them.

A group is the rollouts of one task in one step. A group whose returns are all equal teaches
nothing (every advantage is 0) and is dropped and counted. Std scaling (dividing by the group's
standard deviation) is optional: the Tinker cookbook leaves it off.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from agl_bridge.convert import Trajectory, group_trajectories
from agl_bridge.train.datum import Datum

_STD_EPS = 1e-6


@dataclass
class AdvantageBatch:
    """Trajectories with their advantage, plus what was dropped."""

    items: list[tuple[Trajectory, float]] = field(default_factory=list)
    groups: int = 0
    groups_dropped_zero_variance: int = 0


def group_advantages(trajectories: Iterable[Trajectory], *, std_scaling: bool = False) -> AdvantageBatch:
    """Advantage = return − group mean (÷ group std when `std_scaling`); zero-variance groups dropped."""
    batch = AdvantageBatch()
    for members in group_trajectories(trajectories).values():
        batch.groups += 1
        returns = [t.reward for t in members]
        mean = statistics.fmean(returns)
        spread = statistics.pstdev(returns) if len(returns) > 1 else 0.0
        if spread < _STD_EPS:
            batch.groups_dropped_zero_variance += 1
            continue
        for trajectory in members:
            advantage = trajectory.reward - mean
            if std_scaling:
                advantage /= spread + _STD_EPS
            batch.items.append((trajectory, advantage))
    return batch


def datums_for(items: Sequence[tuple[Trajectory, float]], aggregation: str) -> list[Datum]:
    """One datum per trajectory segment, advantages scaled for the loop's aggregation.

    Losses are summed per token (Tinker). "token_mean" divides by the batch's trained tokens,
    "sequence_mean" by each datum's own trained tokens and the number of datums.
    """
    segments = [(segment, advantage) for trajectory, advantage in items for segment in trajectory.segments]
    trained = [max(1, sum(segment.loss_mask[1:])) for segment, _ in segments]
    total = sum(trained)
    datums = []
    for (segment, advantage), tokens in zip(segments, trained, strict=True):
        if aggregation == "token_mean":
            advantage /= total
        elif aggregation == "sequence_mean":
            advantage /= tokens * len(segments)
        if not math.isfinite(advantage):
            raise ValueError(f"advantage {advantage} is not finite; check the rewards of the batch")
        datums.append(
            Datum.from_sequence(
                segment.input_ids,
                segment.loss_mask,
                segment.sampler_logprobs,
                [advantage * m for m in segment.loss_mask],
            )
        )
    return datums
