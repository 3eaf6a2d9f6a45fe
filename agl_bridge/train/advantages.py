"""Advantages: each rollout's return against its group's, and the datums that carry them.

A group is the rollouts of one task in one step. A group whose returns are all equal teaches
nothing (every advantage is 0) and is dropped and counted. The estimators (`advantage =` in the
run config), for a group of G returns r with mean r̄ and population std σ:

* ``group_mean`` (default; the Tinker cookbook's): A = r − r̄;
* ``mean_std`` (GRPO as published): A = (r − r̄) / (σ + 1e-6) (`advantage_std_scaling = true` says the same);
* ``rloo`` (leave-one-out baseline): A_i = r_i − mean_{j≠i} r_j = G/(G−1) · (r_i − r̄);
* ``dr_grpo`` (Dr. GRPO): A = r − r̄ with no std, and the loss normalised by a constant instead of
  each sequence's length: the datums divide A by `divisor` (the loop passes the step's
  trajectories × the generation budget) and no aggregation divides by lengths.

Datums may also carry one advantage per token (on-policy distillation): see `datums_for`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from agl_bridge.convert import Trajectory, group_trajectories
from agl_bridge.train.datum import Datum

_STD_EPS = 1e-6

AdvantageEstimator = Literal["group_mean", "mean_std", "rloo", "dr_grpo"]
"""How a group's returns become advantages (see the module docs)."""

ADVANTAGE_ESTIMATORS: tuple[str, ...] = get_args(AdvantageEstimator)

Advantage = float | list[list[float]]
"""A trajectory's advantage: one number for all its sampled tokens, or per segment one value per token."""


@dataclass
class AdvantageBatch:
    """Trajectories with their advantage, plus what was dropped and how many trajectories were seen."""

    items: list[tuple[Trajectory, Advantage]] = field(default_factory=list)
    groups: int = 0
    groups_dropped_zero_variance: int = 0
    trajectories: int = 0


def group_advantages(
    trajectories: Iterable[Trajectory], *, estimator: str = "group_mean", std_scaling: bool = False
) -> AdvantageBatch:
    """Each trajectory's advantage within its group by `estimator`; zero-variance groups dropped.

    std_scaling=True is the older spelling of estimator="mean_std" (and only combines with it or
    the default).
    """
    if std_scaling:
        if estimator not in ("group_mean", "mean_std"):
            raise ValueError(f"std_scaling=True is the mean_std estimator; it cannot be combined with {estimator!r}")
        estimator = "mean_std"
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; known: {', '.join(ADVANTAGE_ESTIMATORS)}")
    batch = AdvantageBatch()
    for members in group_trajectories(trajectories).values():
        batch.groups += 1
        batch.trajectories += len(members)
        returns = [t.reward for t in members]
        mean = statistics.fmean(returns)
        spread = statistics.pstdev(returns) if len(returns) > 1 else 0.0
        if spread < _STD_EPS:
            batch.groups_dropped_zero_variance += 1
            continue
        for trajectory in members:
            advantage = trajectory.reward - mean
            if estimator == "mean_std":
                advantage /= spread + _STD_EPS
            elif estimator == "rloo":
                advantage *= len(members) / (len(members) - 1)
            batch.items.append((trajectory, advantage))
    return batch


def constant_divisor(estimator: str, trajectories: int, budget: int) -> float:
    """Dr. GRPO's constant normaliser, the step's trajectories × the generation budget (tokens); 1 otherwise."""
    return float(max(1, trajectories) * budget) if estimator == "dr_grpo" else 1.0


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
