"""GRPO groups: trajectories keyed by group_id, a rollout without one alone in its group."""

from __future__ import annotations

from convert_helpers import call, reward

from agl_bridge.convert import Trajectory, convert_attempt, group_key, group_trajectories


def trajectory(rollout_id: str, group_id: str | None) -> Trajectory:
    result = convert_attempt(
        [call(0, [1], [2], rollout_id=rollout_id)], [reward(1, 1.0, rollout_id=rollout_id)], "succeeded",
        group_id=group_id,
    )  # fmt: skip
    assert isinstance(result, Trajectory)
    return result


def test_trajectories_group_by_group_id_in_first_seen_order() -> None:
    items = [trajectory("r1", "g-b"), trajectory("r2", "g-a"), trajectory("r3", None), trajectory("r4", "g-b")]
    groups = group_trajectories(items)
    assert list(groups) == ["g-b", "g-a", "r3"]
    assert [t.rollout_id for t in groups["g-b"]] == ["r1", "r4"]
    assert group_key(items[2]) == "r3"
