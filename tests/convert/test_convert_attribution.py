"""Reward attribution: the latest trainable call before each reward, named totals, weights, the return."""

from __future__ import annotations

import pytest
from convert_helpers import call, conversation, reward, text_call

from agl_bridge.convert import ConvertOptions, Trajectory, convert_attempt


def convert(calls, rewards, **options) -> Trajectory:
    result = convert_attempt(calls, rewards, "succeeded", ConvertOptions(**options))
    assert isinstance(result, Trajectory), result
    return result


def call_rewards(trajectory: Trajectory) -> dict[int, dict[str, float]]:
    """Rewards by call sequence (calls with none left out)."""
    return {c.sequence: c.rewards for s in trajectory.segments for c in s.calls if c.rewards}


# Three extending turns at sequences 0, 2, 4 so rewards can sit between them.
TURNS = [([1, 2, 3], [10, 11]), ([4], [12]), ([5, 6], [13, 14, 15])]


def test_reward_after_the_last_call_goes_to_the_last_call() -> None:
    trajectory = convert(conversation(TURNS, step=2), [reward(5, 1.0)])
    assert call_rewards(trajectory) == {4: {"reward": 1.0}}
    assert trajectory.reward == 1.0 and trajectory.rewards == {"reward": 1.0}
    assert trajectory.unattached_rewards == {}


def test_rewards_between_calls_go_to_the_call_just_before_each() -> None:
    trajectory = convert(conversation(TURNS, step=2), [reward(1, 0.25), reward(3, 0.5), reward(5, 2.0)])
    assert call_rewards(trajectory) == {0: {"reward": 0.25}, 2: {"reward": 0.5}, 4: {"reward": 2.0}}
    assert trajectory.rewards == {"reward": 2.75} and trajectory.reward == 2.75


def test_several_rewards_after_one_call_add_up_on_that_call() -> None:
    calls = conversation(TURNS, step=3)  # sequences 0, 3, 6
    trajectory = convert(calls, [reward(1, 0.5), reward(2, 0.25), reward(7, 1.0)])
    assert call_rewards(trajectory) == {0: {"reward": 0.75}, 6: {"reward": 1.0}}
    assert trajectory.rewards == {"reward": 1.75}


def test_reward_before_any_call_is_attached_to_no_call_but_counts() -> None:
    calls = conversation(TURNS, first_sequence=1, step=2)  # sequences 1, 3, 5
    trajectory = convert(calls, [reward(0, -1.0, "penalty"), reward(6, 1.0)])
    assert call_rewards(trajectory) == {5: {"reward": 1.0}}
    assert trajectory.unattached_rewards == {"penalty": -1.0}
    assert trajectory.rewards == {"penalty": -1.0, "reward": 1.0}
    assert trajectory.reward == 0.0


def test_rollout_level_reward_attaches_to_no_call_whatever_its_sequence() -> None:
    # Recorded outside any attempt: its sequence is from another space, so it cannot be ordered.
    trajectory = convert(conversation(TURNS), [reward(99, 0.5, "verifier", attempt_id=None)])
    assert call_rewards(trajectory) == {}
    assert trajectory.unattached_rewards == {"verifier": 0.5} and trajectory.reward == 0.5


def test_named_rewards_stay_apart_and_weights_make_the_return() -> None:
    rewards = [reward(1, 1.0, "format"), reward(5, 0.0, "correct"), reward(6, 1.0, "correct"), reward(7, 3.0, "length")]
    trajectory = convert(
        conversation(TURNS, step=2), rewards, reward_weights={"format": 0.1, "length": -0.5}, default_reward_weight=2.0
    )
    assert call_rewards(trajectory) == {0: {"format": 1.0}, 4: {"correct": 1.0, "length": 3.0}}
    assert trajectory.rewards == {"format": 1.0, "correct": 1.0, "length": 3.0}  # recording order
    assert trajectory.reward == pytest.approx(0.1 * 1.0 + 2.0 * 1.0 - 0.5 * 3.0)


def test_default_weights_are_one() -> None:
    trajectory = convert(conversation(TURNS), [reward(3, 0.5, "a"), reward(4, 0.25, "b")])
    assert trajectory.reward == 0.75


def test_rewards_skip_text_calls_and_unselected_agents() -> None:
    calls = [
        *conversation(TURNS[:1], agent="solver"),  # sequence 0
        text_call(1),
        call(2, [7, 8], [9], agent="critic"),
    ]
    trajectory = convert(calls, [reward(3, 1.0)], agent_names=["solver"])
    assert call_rewards(trajectory) == {0: {"reward": 1.0}}


def test_reward_after_n_choices_goes_to_the_first_choice() -> None:
    calls = [call(0, [1, 2], [3], choice=0), call(0, [1, 2], [4], choice=1), call(0, [1, 2], [5], choice=2)]
    trajectory = convert(calls, [reward(1, 1.0)])
    by_choice = {c.choice_index: c.rewards for s in trajectory.segments for c in s.calls}
    assert by_choice == {0: {"reward": 1.0}, 1: {}, 2: {}}


def test_rewards_given_in_any_order_are_attributed_by_sequence() -> None:
    rewards = [reward(5, 2.0), reward(1, 0.25), reward(3, 0.5)]
    trajectory = convert(list(reversed(conversation(TURNS, step=2))), rewards)
    assert call_rewards(trajectory) == {0: {"reward": 0.25}, 2: {"reward": 0.5}, 4: {"reward": 2.0}}
    assert trajectory.rewards == {"reward": 2.75}
