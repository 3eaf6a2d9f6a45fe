"""A step's datums: one per trajectory segment, its advantage scaled for the run's loss aggregation."""

from __future__ import annotations

import math
from collections.abc import Sequence

from agl_bridge.convert import Trajectory
from agl_bridge.primitives.advantages import constant_divisor
from agl_bridge.primitives.datum import Datum
from agl_bridge.train.advantages import Advantage, AdvantageBatch


def batch_datums(batch: AdvantageBatch, *, aggregation: str, estimator: str, budget: int) -> list[Datum]:
    """A step's datums from its advantage batch: aggregation and the estimator's constant divisor applied."""
    if not batch.items:
        return []
    divisor = constant_divisor(estimator, batch.trajectories, budget)
    return datums_for(batch.items, aggregation, divisor=divisor)


def datums_for(items: Sequence[tuple[Trajectory, Advantage]], aggregation: str, *, divisor: float = 1.0) -> list[Datum]:
    """One datum per trajectory segment, advantages scaled for the loop's aggregation.

    Losses are summed per token (Tinker). "token_mean" divides by the batch's trained tokens,
    "sequence_mean" by each datum's own trained tokens and the number of datums; `divisor` divides
    every advantage by a constant too (Dr. GRPO's). A per-token advantage (a list per segment,
    aligned with its `input_ids`) is scaled the same way.
    """
    segments = [
        (segment, advantage if isinstance(advantage, float | int) else advantage[index])
        for trajectory, advantage in items
        for index, segment in enumerate(trajectory.segments)
    ]
    trained = [max(1, sum(segment.loss_mask[1:])) for segment, _ in segments]
    total = sum(trained)
    datums = []
    for (segment, advantage), tokens in zip(segments, trained, strict=True):

        def scaled(value: float, tokens: int = tokens) -> float:
            if aggregation == "token_mean":
                value /= total
            elif aggregation == "sequence_mean":
                value /= tokens * len(segments)
            return value / divisor if divisor != 1.0 else value

        if isinstance(advantage, float | int):
            advantage = scaled(advantage)
            values = [advantage * m for m in segment.loss_mask]
        else:
            values = [scaled(a) * m for a, m in zip(advantage, segment.loss_mask, strict=True)]
        if not all(math.isfinite(v) for v in values):
            raise ValueError("an advantage is not finite; check the rewards (or teacher logprobs) of the batch")
        datums.append(Datum.from_sequence(segment.input_ids, segment.loss_mask, segment.sampler_logprobs, values))
    return datums
