"""Reward shaping: DAPO's soft overlong penalty and the n-gram repetition penalty, by hand; stored as named rewards."""

from __future__ import annotations

import pytest
from algo_helpers import random_trajectories
from shared_helpers import collect

from agl_bridge.convert import ConvertOptions
from agl_bridge.store import SQLiteStore
from agl_bridge.train.config import OverlongPenaltyConfig, RepetitionPenaltyConfig
from agl_bridge.train.shaping import (
    OVERLONG,
    REPETITION,
    add_rewards,
    overlong_penalty,
    repetition_penalty,
    sampled_responses,
    shaping_rewards,
)


@pytest.mark.parametrize(("length", "expected"), [(0, 0.0), (6, 0.0), (7, -0.25), (9, -0.75), (10, -1.0), (50, -1.0)])
def test_overlong_penalty_is_zero_then_linear_then_minus_one(length: int, expected: float) -> None:
    assert overlong_penalty(length, OverlongPenaltyConfig(max_tokens=10, buffer=4)) == pytest.approx(expected)


def test_repetition_penalty_counts_ngrams_within_each_response() -> None:
    config = RepetitionPenaltyConfig(ngram=2, threshold=0.3)
    # (1,2),(2,1),(1,2),(2,1),(1,2): 2 distinct of 5 -> redundancy 0.6 -> -(0.6 - 0.3) / 0.7
    assert repetition_penalty([[1, 2, 1, 2, 1, 2]], config) == pytest.approx(-0.3 / 0.7)
    # two responses [1, 2]: (1,2) twice -> 0.5; the gram (2,1) across the call boundary is not counted
    assert repetition_penalty([[1, 2], [1, 2]], config) == pytest.approx(-0.2 / 0.7)
    assert repetition_penalty([[1, 2, 3, 4]], config) == 0.0
    assert repetition_penalty([[1], [2]], config) == 0.0  # no n-gram at all
    assert repetition_penalty([[5] * 20], RepetitionPenaltyConfig(ngram=4, threshold=0.0)) == pytest.approx(-16 / 17)


def test_shaping_reads_the_sampled_responses_of_every_segment() -> None:
    trajectory = random_trajectories(3)[0]
    responses = sampled_responses(trajectory)
    assert len(responses) == trajectory.num_calls
    assert sum(map(len, responses)) == sum(sum(s.loss_mask) for s in trajectory.segments)
    shaped = shaping_rewards(trajectory, OverlongPenaltyConfig(max_tokens=4, buffer=2), None)
    assert set(shaped) == {OVERLONG}
    assert shaped[OVERLONG] == overlong_penalty(sum(map(len, responses)), OverlongPenaltyConfig(4, 2))
    assert set(shaping_rewards(trajectory, None, RepetitionPenaltyConfig())) == {REPETITION}


async def test_added_rewards_are_stored_by_name_and_weighed_into_the_return(store: SQLiteStore) -> None:
    trajectories = random_trajectories(0)[:3]
    options = ConvertOptions(reward_weights={OVERLONG: 0.5})
    before = {t.rollout_id: (dict(t.rewards), t.reward) for t in trajectories}
    await add_rewards([(t, {OVERLONG: -1.0, REPETITION: -0.2}) for t in trajectories], options, store)
    for t in trajectories:
        rewards, reward = before[t.rollout_id]
        assert t.rewards == {**rewards, OVERLONG: -1.0, REPETITION: -0.2}
        assert t.reward == pytest.approx(reward + 0.5 * -1.0 + 1.0 * -0.2)
        stored = await collect(store.iter_rewards(t.rollout_id, t.attempt_id))
        assert sorted((r.name, r.value) for r in stored) == [(OVERLONG, -1.0), (REPETITION, -0.2)]


def test_offline_runs_take_the_estimator_and_shape_in_memory(tmp_path, tiny_model_dir) -> None:
    from agl_bridge.convert import write_trajectories
    from agl_bridge.train.config import config_from_dict
    from agl_bridge.train.grpo import GRPOTrainer
    from agl_bridge.train.run_log import read_metrics

    data = tmp_path / "trajectories.jsonl"
    write_trajectories(random_trajectories(5, groups=3, sizes=(3, 4, 2)), data)
    before = data.read_text()
    config = config_from_dict(
        {
            "offline_data": str(data),
            "model": str(tiny_model_dir),
            "run_dir": str(tmp_path / "run"),
            "steps": 2,
            "batch_size": 3,
            "advantage": "dr_grpo",
            "overlong_penalty": {"max_tokens": 6, "buffer": 3},
            "tensorboard": False,
        }
    )
    GRPOTrainer(config).run()
    records = [r for r in read_metrics(tmp_path / "run") if r["phase"] == "train"]
    assert [r["step"] for r in records] == [1, 2]
    assert all(-1.0 <= r["reward_overlong_mean"] < 0 and r["datums"] > 0 for r in records)
    assert data.read_text() == before, "offline data is read, never written"
