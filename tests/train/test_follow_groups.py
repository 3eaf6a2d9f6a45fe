"""Which groups the follow trainer takes: complete by size, or by timeout with a minimum size; and its config."""

from __future__ import annotations

import pytest

from agl_bridge.errors import ConfigError
from agl_bridge.train.config import config_from_dict
from agl_bridge.train.follow_groups import ready_groups
from agl_bridge.types import Rollout, RolloutOrigin, RolloutStatus


def rollout(rid: str, group: str | None, status: str = "succeeded", finished_at: float = 0.0) -> Rollout:
    return Rollout(
        rollout_id=rid,
        task=None,
        group_id=group,
        status=RolloutStatus(status),
        updated_at=finished_at,
        origin=RolloutOrigin.EXTERNAL,
    )


def test_a_group_is_complete_with_group_size_finished_and_takes_the_first_to_finish() -> None:
    rollouts = [rollout(f"a{i}", "a", finished_at=10 - i) for i in range(5)] + [
        rollout("b0", "b"),
        rollout("b1", "b", status="running"),
        rollout("c0", "c", status="failed", finished_at=1.0),
        rollout("c1", "c", status="timed_out", finished_at=2.0),
        rollout("n0", None),
    ]
    ready, counts = ready_groups(rollouts, group_size=2, min_group_size=2, group_timeout_s=None, now=100.0)
    assert [(g.group_id, [r.rollout_id for r in g.rollouts]) for g in ready] == [
        ("c", ["c0", "c1"]),  # failed members count as finished: they just train nothing
        ("a", ["a4", "a3"]),  # the first two of a to finish; a2..a0 wait for a later group
    ]
    assert (counts.running, counts.finished, counts.incomplete_groups, counts.unnamed) == (1, 1, 1, 1)
    assert counts.next_timeout_at is None


def test_the_timeout_completes_a_group_of_at_least_min_group_size() -> None:
    rollouts = [
        rollout("a0", "a", finished_at=10.0),
        rollout("a1", "a", finished_at=11.0),
        rollout("b0", "b", finished_at=5.0),
    ]
    early, counts = ready_groups(rollouts, group_size=4, min_group_size=2, group_timeout_s=30.0, now=20.0)
    assert early == [] and counts.next_timeout_at == 40.0
    late, counts = ready_groups(rollouts, group_size=4, min_group_size=2, group_timeout_s=30.0, now=40.0)
    assert [g.group_id for g in late] == ["a"] and counts.finished == 1  # b alone is below the minimum


def test_follow_settings_are_checked_by_name() -> None:
    config = config_from_dict({"mode": "follow", "follow": {"port": 0, "group_timeout_s": 5}})
    assert (config.follow.port, config.follow.group_timeout_s, config.follow.min_group_size) == (0, 5, 2)
    with pytest.raises(ConfigError, match="unknown key 'follow.prot'"):
        config_from_dict({"mode": "follow", "follow": {"prot": 1}})
    with pytest.raises(ConfigError, match="follow.min_group_size must be between 1 and group_size"):
        config_from_dict({"mode": "follow", "group_size": 2, "follow": {"min_group_size": 3}})
    with pytest.raises(ConfigError, match='sampler = "remote"'):
        config_from_dict({"mode": "follow", "follow": {"store": "serve.sqlite"}})
    with pytest.raises(ConfigError, match="cannot be combined"):
        config_from_dict({"mode": "follow", "offline_data": "x.sqlite"})
    with pytest.raises(ConfigError, match="mode must be"):
        config_from_dict({"mode": "folow"})
    with pytest.raises(ConfigError, match="follow.wait_report_s must be > 0"):
        config_from_dict({"mode": "follow", "follow": {"wait_report_s": 0}})
