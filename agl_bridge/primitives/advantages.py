"""Advantage estimators: each return of a group against the group's (pure Python, no torch).

For a group of G returns r with mean r̄ and population std σ (`advantage =` in the run config):

* ``group_mean`` (default; the Tinker cookbook's): A = r − r̄;
* ``mean_std`` (GRPO as published): A = (r − r̄) / (σ + 1e-6) (`advantage_std_scaling = true` says the same);
* ``rloo`` (leave-one-out baseline): A_i = r_i − mean_{j≠i} r_j = G/(G−1) · (r_i − r̄);
* ``dr_grpo`` (Dr. GRPO): A = r − r̄ with no std, and the loss normalised by a constant instead of
  each sequence's length (`constant_divisor`) and no aggregation dividing by lengths.

A group whose returns are all equal teaches nothing (every advantage is 0): `group_advantage_values`
says so with None, and the caller drops and counts it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Literal, get_args

_STD_EPS = 1e-6

AdvantageEstimator = Literal["group_mean", "mean_std", "rloo", "dr_grpo"]
"""How a group's returns become advantages (see the module docs)."""

ADVANTAGE_ESTIMATORS: tuple[str, ...] = get_args(AdvantageEstimator)


def resolve_estimator(estimator: str, *, std_scaling: bool = False) -> str:
    """The estimator a run means: std_scaling=True is the older spelling of "mean_std" (and only
    combines with it or the default); an unknown name is refused, naming the known ones."""
    if std_scaling:
        if estimator not in ("group_mean", "mean_std"):
            raise ValueError(f"std_scaling=True is the mean_std estimator; it cannot be combined with {estimator!r}")
        estimator = "mean_std"
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; known: {', '.join(ADVANTAGE_ESTIMATORS)}")
    return estimator


def group_advantage_values(returns: Sequence[float], estimator: str) -> list[float] | None:
    """Each return's advantage within its group by a resolved `estimator`; None when all are equal."""
    mean = statistics.fmean(returns)
    spread = statistics.pstdev(returns) if len(returns) > 1 else 0.0
    if spread < _STD_EPS:
        return None
    values = [r - mean for r in returns]
    if estimator == "mean_std":
        return [v / (spread + _STD_EPS) for v in values]
    if estimator == "rloo":
        return [v * len(returns) / (len(returns) - 1) for v in values]
    return values


def constant_divisor(estimator: str, trajectories: int, budget: int) -> float:
    """Dr. GRPO's constant normaliser, the step's trajectories × the generation budget (tokens); 1 otherwise."""
    return float(max(1, trajectories) * budget) if estimator == "dr_grpo" else 1.0
