"""GRPO groups: the trajectories of the rollouts of one task in one step, keyed by the rollout's `group_id`.

The runner gives every rollout of one task in one step the same `group_id`; a GRPO advantage is
a trajectory's reward minus its group's mean. A rollout without a group_id is a group of its own
(keyed by its rollout id), whose advantage is then always 0: nothing to learn from it.
"""

from __future__ import annotations

from collections.abc import Iterable

from agl_bridge.convert.records import Trajectory


def group_key(trajectory: Trajectory) -> str:
    """The group a trajectory belongs to: its group_id, else its own rollout id."""
    return trajectory.group_id if trajectory.group_id is not None else trajectory.rollout_id


def group_trajectories(trajectories: Iterable[Trajectory]) -> dict[str, list[Trajectory]]:
    """Trajectories by group key, groups in first-seen order, members in the order given."""
    groups: dict[str, list[Trajectory]] = {}
    for trajectory in trajectories:
        groups.setdefault(group_key(trajectory), []).append(trajectory)
    return groups
