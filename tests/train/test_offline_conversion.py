"""Offline training from a store converts with the run's options (it once used the defaults: issue 33's drift)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agl_bridge.errors import ConfigError
from agl_bridge.store import SQLiteStore
from agl_bridge.train.config import GRPOConfig
from agl_bridge.train.offline import offline_groups
from agl_bridge.types import AttemptStatus, LLMCall, Reward, RolloutStatus


def a_call(rollout_id: str, attempt_id: str, prompt: list[int], response: list[int]) -> LLMCall:
    return LLMCall(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        model="tiny",
        prompt_token_ids=prompt,
        response_token_ids=response,
        response_logprobs=[-0.5] * len(response),
    )


async def _build(path: Path) -> None:
    """Two rollouts of one task: one rewarded (with a side call before its turn), one never rewarded."""
    async with SQLiteStore(path) as store:
        for rollout_id, rewarded in [("ro-1", True), ("ro-2", False)]:
            await store.create_rollout({}, group_id="task-1", rollout_id=rollout_id)
            attempt = await store.start_attempt(rollout_id)
            await store.add_llm_call(a_call(rollout_id, attempt.attempt_id, [50], [51]))  # a lone title call
            await store.add_llm_call(a_call(rollout_id, attempt.attempt_id, [1, 2], [3]))
            if rewarded:
                await store.add_reward(
                    Reward(rollout_id=rollout_id, attempt_id=attempt.attempt_id, value=1.0, name="a")
                )
            await store.finish_attempt(attempt.attempt_id, AttemptStatus.SUCCEEDED)
            await store.set_rollout_status(rollout_id, RolloutStatus.SUCCEEDED)


def test_offline_groups_from_a_store_honour_the_runs_conversion_options(tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite"
    asyncio.run(_build(store))

    def groups(**keys: object) -> list[list]:
        config = GRPOConfig(offline_data=str(store), **keys)  # type: ignore[arg-type]
        return asyncio.run(offline_groups(str(store), config.convert_options()))

    (default,) = groups()
    assert [t.rollout_id for t in default] == ["ro-1"]  # no reward: dropped
    assert [[c.call_class for s in t.segments for c in s.calls] for t in default] == [["main"]]
    (kept,) = groups(missing_reward="zero", reward_weights={"a": 0.5}, train_call_classes=["main", "side"])
    assert [(t.rollout_id, t.reward) for t in kept] == [("ro-1", 0.5), ("ro-2", 0.0)]
    assert [len(t.segments) for t in kept] == [2, 2]


def test_a_wrong_train_call_class_names_the_key() -> None:
    with pytest.raises(ConfigError, match="train_call_classes has 'titles', which is not a call class"):
        GRPOConfig(train_call_classes=["main", "titles"]).validate()
    with pytest.raises(ConfigError, match="train_call_classes is empty"):
        GRPOConfig(train_call_classes=[]).validate()
