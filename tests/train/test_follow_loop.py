"""The follow loop over a store an outside harness filled: groups taken once, evaluations, stale groups, resume."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

from agl_bridge.primitives import TrainingClient
from agl_bridge.store import SQLiteStore
from agl_bridge.train.config import FollowConfig, GRPOConfig
from agl_bridge.train.follow import FollowLoop
from agl_bridge.train.loop_state import resume_latest
from agl_bridge.train.run_log import RunLog
from agl_bridge.train.step import TRAIN_KEYS
from agl_bridge.train.step_record import STEP_RECORD_KEYS
from agl_bridge.types import AttemptStatus, LLMCall, Reward, RolloutTask


async def harness_group(
    store_path: Path, task: str, rewards: list[float], *, version: int = 0, eval: bool = False
) -> None:
    """What a harness leaves for one task: a rollout per reward, each with one call, its reward, finished."""
    async with SQLiteStore(store_path) as store:
        for index, value in enumerate(rewards):
            rollout_id = f"{task}-{index}"
            await store.register_attempt(rollout_id, "0", RolloutTask(task_id=task, eval=eval))
            await store.add_llm_call(
                LLMCall(
                    rollout_id=rollout_id,
                    attempt_id="0",
                    model="tiny",
                    prompt_token_ids=[5, 6, 7, 8],
                    response_token_ids=[9, 10 + index],
                    response_logprobs=[-1.0, -1.5],
                    token_policy_versions=[version, version],
                )
            )
            await store.report_reward(Reward(rollout_id=rollout_id, attempt_id="0", value=value))
            await store.complete_attempt(rollout_id, "0", AttemptStatus.SUCCEEDED)


async def consumed(store_path: Path) -> dict[str, int | None]:
    async with SQLiteStore(store_path) as store:
        return {r.rollout_id: r.consumed_step for r in await store.list_rollouts()}


def config(run_dir: Path, steps: int, max_staleness: int = 3) -> GRPOConfig:
    return GRPOConfig(
        mode="follow",
        run_dir=str(run_dir),
        steps=steps,
        batch_size=1,
        group_size=2,
        checkpoint_every=1,
        max_staleness=max_staleness,
        lora_rank=8,
        tensorboard=False,
        follow=FollowConfig(wait_report_s=0.2),
    )


def test_groups_train_once_evals_are_logged_and_a_resume_gives_back_what_later_steps_took(
    tmp_path: Path, make_client: Callable[..., TrainingClient]
) -> None:
    run_dir, store_path = tmp_path / "run", tmp_path / "run" / "store.sqlite"
    run_dir.mkdir()
    since = time.time()
    asyncio.run(harness_group(store_path, "held-out", [0.5], eval=True))
    asyncio.run(harness_group(store_path, "a", [1.0, 0.0]))
    asyncio.run(harness_group(store_path, "b", [0.0, 1.0]))
    log = RunLog(run_dir, tensorboard=False)
    first = FollowLoop(config(run_dir, steps=1), make_client(), store_path, log, where="test")
    summary = asyncio.run(first.run({"next_step": 0, "since": since, "eval_start": None}, 0))
    assert summary.steps == 1 and summary.eval_start == 0.5
    taken = asyncio.run(consumed(store_path))
    assert taken == {"held-out-0": 0, "a-0": 1, "a-1": 1, "b-0": None, "b-1": None}

    # The run died during step 2, after taking group b but before its checkpoint.
    async def take_b() -> None:
        async with SQLiteStore(store_path) as store:
            await store.mark_consumed(["b-0", "b-1"], 2)

    asyncio.run(take_b())
    client = make_client()
    state = resume_latest(client, run_dir, 0, log, sync=False)
    assert state is not None and (state["next_step"], state["policy_version"], state["since"]) == (1, 1, since)
    resumed = FollowLoop(config(run_dir, steps=2), client, store_path, log, where="test")
    asyncio.run(resumed.run(state, state["policy_version"]))
    log.close()
    taken = asyncio.run(consumed(store_path))
    assert (taken["b-0"], taken["b-1"]) == (2, 2)  # trained by the resumed step 2: not skipped, not twice
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["phase"] == "train"]
    assert [(r["step"], r["policy_version"], r["rollouts"], r["staleness_max"]) for r in train] == [
        (1, 1, 2, 0),
        (2, 2, 2, 1),
    ]
    assert all(r["time_to_weights_s"] is not None and r["time_to_weights_s"] >= 0 for r in train)
    assert all(STEP_RECORD_KEYS.union(TRAIN_KEYS) <= r.keys() for r in train), "every mode writes the same step record"
    (evaluation,) = [r for r in records if r["phase"] == "eval"]
    assert (evaluation["step"], evaluation["eval_reward"], evaluation["eval_rollouts"]) == (0, 0.5, 1)


def test_a_group_sampled_by_a_stale_policy_is_dropped_and_counted(
    tmp_path: Path, make_client: Callable[..., TrainingClient]
) -> None:
    run_dir, store_path = tmp_path / "run", tmp_path / "run" / "store.sqlite"
    run_dir.mkdir()
    since = time.time()
    asyncio.run(harness_group(store_path, "old", [1.0, 0.0], version=0))
    asyncio.run(harness_group(store_path, "new", [1.0, 0.0], version=4))
    log = RunLog(run_dir, tensorboard=False)
    loop = FollowLoop(config(run_dir, steps=5, max_staleness=1), make_client(), store_path, log, where="test")
    state = {"next_step": 4, "since": since, "eval_start": None}  # as if 4 steps had trained: version 4
    asyncio.run(loop.run(state, 4))
    log.close()
    (record,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert (record["step"], record["groups_stale_dropped"], record["rollouts_stale_dropped"]) == (5, 1, 2)
    assert (record["rollouts"], record["staleness_max"], record["policy_version"]) == (2, 0, 5)
    assert asyncio.run(consumed(store_path)) == {"old-0": 5, "old-1": 5, "new-0": 5, "new-1": 5}
