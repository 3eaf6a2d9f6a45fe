"""A step's advantages: the trajectories of each group (one task in one step) scored against each
other by the run's estimator (`agl_bridge.primitives.advantages`); zero-variance groups dropped and counted.

Datums may also carry one advantage per token (on-policy distillation): see `agl_bridge.train.datums`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from agl_bridge.convert import Trajectory, group_trajectories
from agl_bridge.primitives.advantages import group_advantage_values, resolve_estimator

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
    estimator = resolve_estimator(estimator, std_scaling=std_scaling)
    batch = AdvantageBatch()
    for members in group_trajectories(trajectories).values():
        batch.groups += 1
        batch.trajectories += len(members)
        values = group_advantage_values([t.reward for t in members], estimator)
        if values is None:
            batch.groups_dropped_zero_variance += 1
            continue
        batch.items.extend(zip(members, values, strict=True))
    return batch
