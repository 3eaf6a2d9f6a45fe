"""What every store backend must do for rollouts we do not launch, parametrized by backend.

Each test runs on every backend in `BACKENDS` (SQLite in a temporary file, PostgreSQL in a new
database of the session's throwaway server; skipped, saying why, where none can run). Only the
public `Store` API is used here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from agl_bridge.store import (
    AttemptFinishedError,
    AttemptNotFoundError,
    PostgresStore,
    SQLiteStore,
    Store,
    TaskConflictError,
)
from agl_bridge.types import AttemptStatus, CallClass, LLMCall, Reward, RolloutOrigin, RolloutStatus, RolloutTask

BACKENDS: dict[str, Callable[[pytest.FixtureRequest, Path], Any]] = {
    "sqlite": lambda request, folder: SQLiteStore(folder / "contract.db"),
    "postgresql": lambda request, folder: PostgresStore(request.getfixturevalue("postgres_dsn")),
}


@pytest.fixture(params=sorted(BACKENDS))
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """An open store of each backend."""
    async with BACKENDS[request.param](request, tmp_path) as opened:
        yield opened


def call(rollout_id: str | None, attempt_id: str | None) -> LLMCall:
    return LLMCall(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        model="tiny",
        prompt_token_ids=[1, 2],
        response_token_ids=[3],
        response_logprobs=[-0.5],
        token_policy_versions=[0],
    )


async def test_the_first_record_registers_its_rollout_and_attempt_as_running(backend: Store) -> None:
    await backend.add_llm_call(call("ext", "0"))
    await backend.add_llm_call(call("ext", "0"))
    await backend.add_reward(Reward(rollout_id="other", attempt_id="0", value=1.0))  # a reward first registers too
    rollout = await backend.get_rollout("ext")
    assert rollout is not None and (rollout.status, rollout.origin, rollout.attempts) == (
        RolloutStatus.RUNNING, RolloutOrigin.EXTERNAL, 1,
    )  # fmt: skip
    (attempt,) = await backend.list_attempts("ext")
    assert (attempt.attempt_id, attempt.number, attempt.status) == ("0", 1, AttemptStatus.RUNNING)
    other = await backend.get_attempt("0", "other")
    assert other is not None and other.rollout_id == "other"  # the same attempt id in two rollouts
    with pytest.raises(ValueError, match="several rollouts"):
        await backend.finish_attempt("0", AttemptStatus.FAILED)
    await backend.add_llm_call(call(None, None))  # outside any rollout: nothing to register
    assert {r.rollout_id for r in await backend.list_rollouts()} == {"ext", "other"}


async def test_a_runner_rollout_keeps_its_own_attempts(backend: Store) -> None:
    created = await backend.create_rollout({"q": 1}, group_id="g", rollout_id="mine")
    attempt = await backend.start_attempt(created.rollout_id)
    await backend.add_llm_call(call("mine", attempt.attempt_id))
    await backend.add_llm_call(call("mine", "stray"))  # not one of the runner's runs: not registered
    assert [a.attempt_id for a in await backend.list_attempts("mine")] == [attempt.attempt_id]
    assert (await backend.get_rollout("mine")).origin is RolloutOrigin.RUNNER  # type: ignore[union-attr]


async def test_keys_first_written_in_one_batch_register_as_if_one_by_one(backend: Store) -> None:
    mine = await backend.start_attempt((await backend.create_rollout({"q": 1}, rollout_id="mine")).rollout_id)
    await backend.add_llm_call(call("done", "0"))
    await backend.complete_attempt("done", "0", AttemptStatus.SUCCEEDED)
    await backend.add_llm_call(call("ext", "a"))
    # One write: new attempts of a known rollout and of a new one (numbered in key order), a record outside
    # any attempt, a stray attempt of a runner's rollout, and a new attempt of a finished rollout.
    await backend.add_llm_calls(
        [call("ext", "c"), call("ext", "b"), call("new", "x"), call("new", "w"), call("lone", None)]
        + [call("mine", "stray"), call("done", "1")]
    )
    numbers = {r: [(a.attempt_id, a.number) for a in await backend.list_attempts(r)] for r in ("ext", "new", "lone")}
    assert numbers == {"ext": [("a", 1), ("b", 2), ("c", 3)], "new": [("w", 1), ("x", 2)], "lone": []}
    rollouts = {r.rollout_id: r for r in await backend.list_rollouts()}
    assert [(rollouts[r].status, rollouts[r].attempts, rollouts[r].origin) for r in ("ext", "new", "lone")] == [
        (RolloutStatus.RUNNING, 3, RolloutOrigin.EXTERNAL),
        (RolloutStatus.RUNNING, 2, RolloutOrigin.EXTERNAL),
        (RolloutStatus.RUNNING, 0, RolloutOrigin.EXTERNAL),
    ]
    assert [a.attempt_id for a in await backend.list_attempts("mine")] == [mine.attempt_id]
    assert [a.attempt_id for a in await backend.list_attempts("done")] == ["0"]
    assert (rollouts["done"].status, rollouts["done"].attempts) == (RolloutStatus.SUCCEEDED, 1)


async def test_a_declared_class_and_parent_round_trip_through_every_reader(backend: Store) -> None:
    declared = [
        dataclasses.replace(call("ext", "0"), declared_class=CallClass.MAIN),
        dataclasses.replace(call("ext", "0"), declared_class=CallClass.SIDE, declared_parent="0", carries=[0]),
        dataclasses.replace(call("ext", "0"), declared_parent="chatcmpl-unknown"),  # unresolved: kept raw
        call("ext", "0"),  # nothing declared
    ]
    await backend.add_llm_calls(declared[:2])
    for one in declared[2:]:
        await backend.add_llm_call(one)
    expected = [
        (CallClass.MAIN, None),
        (CallClass.SIDE, "0"),
        (None, "chatcmpl-unknown"),
        (None, None),
    ]
    assert [(c.declared_class, c.declared_parent) async for c in backend.iter_llm_calls("ext", "0")] == expected
    assert [(c.declared_class, c.declared_parent) async for c in backend.iter_all_calls()] == expected
    for tokens_only in (False, True):  # the converter reads tokens-only rows
        (records,) = [r async for r in backend.iter_rollout_records(["ext"], tokens_only=tokens_only)]
        (attempt,) = records.attempts
        assert [(c.declared_class, c.declared_parent) for c in attempt.calls] == expected
        assert all(type(c.declared_class) is CallClass for c in attempt.calls if c.declared_class is not None)
    walked = [r async for r in backend.iter_rollout_records(tokens_only=True)]  # the whole-store walk
    assert [(c.declared_class, c.declared_parent) for r in walked for a in r.attempts for c in a.calls] == expected
    assert [c.carries for r in walked for a in r.attempts for c in a.calls] == [[], [0], [], []]
    assert [c.carries async for c in backend.iter_llm_calls("ext", "0")] == [[], [0], [], []]


async def test_start_names_the_task_and_refuses_another(backend: Store) -> None:
    started = await backend.register_attempt("r", "0", RolloutTask(task_id="t", metadata={"n": 3}, eval=True))
    assert (started.group_id, started.task, started.eval, started.status) == (
        "t",
        {"n": 3},
        True,
        RolloutStatus.RUNNING,
    )
    named = await backend.register_attempt("r", "0", RolloutTask(task_id="t"))  # the same task again: fine
    assert named.task == {"n": 3}
    with pytest.raises(TaskConflictError, match="'t', not 'u'"):
        await backend.complete_attempt("r", "0", AttemptStatus.SUCCEEDED, task=RolloutTask(task_id="u"))
    bare = await backend.register_attempt("s", "0", RolloutTask(task_id="only-id"))
    assert bare.task == "only-id" and bare.eval is False


async def test_complete_ends_the_rollout_with_its_last_running_attempt(backend: Store) -> None:
    await backend.register_attempt("r", "a")
    await backend.register_attempt("r", "b")
    after_a = await backend.complete_attempt("r", "a", AttemptStatus.SUCCEEDED)
    assert after_a.status is RolloutStatus.RUNNING  # b still runs
    after_b = await backend.complete_attempt("r", "b", AttemptStatus.FAILED, error="boom")
    assert after_b.status is RolloutStatus.SUCCEEDED  # one attempt succeeded
    with pytest.raises(AttemptFinishedError, match="already finished"):
        await backend.complete_attempt("r", "b", AttemptStatus.SUCCEEDED)
    with pytest.raises(AttemptNotFoundError, match="no attempt 'z' of rollout 'r'"):
        await backend.complete_attempt("r", "z", AttemptStatus.SUCCEEDED)
    with pytest.raises(AttemptFinishedError, match="new rollout id"):
        await backend.register_attempt("r", "c")
    await backend.register_attempt("f", "0")
    failed = await backend.complete_attempt("f", "0", AttemptStatus.FAILED)
    assert failed.status is RolloutStatus.FAILED


async def test_a_reported_reward_needs_a_live_attempt(backend: Store) -> None:
    first = await backend.report_reward(Reward(rollout_id="r", attempt_id="0", value=0.5))  # registers r / 0
    assert first == 0 and (await backend.get_rollout("r")) is not None
    await backend.complete_attempt("r", "0", AttemptStatus.SUCCEEDED)
    with pytest.raises(AttemptFinishedError, match="report rewards before finishing"):
        await backend.report_reward(Reward(rollout_id="r", attempt_id="0", value=1.0))
    with pytest.raises(AttemptFinishedError, match="already finished"):
        await backend.report_reward(Reward(rollout_id="r", attempt_id="new", value=1.0))
    assert [r.value async for r in backend.iter_rewards("r")] == [0.5]
    with pytest.raises(ValueError, match="rollout_id and attempt_id"):
        await backend.report_reward(Reward(value=1.0))


def _idle_s_between(older: float, newer: float) -> float:
    """An idle timeout whose cutoff, from now, falls midway between two moments: activity before `older` is
    idle, activity after `newer` is not, however long the writes in between took on a busy machine."""
    return time.time() - (older + newer) / 2


async def test_idle_external_rollouts_time_out_and_active_or_runner_ones_do_not(backend: Store) -> None:
    await backend.register_attempt("idle", "0")
    await backend.add_llm_call(call("records-only", None))  # a rollout with no attempt at all
    runner = await backend.create_rollout({}, rollout_id="runner")
    await backend.start_attempt(runner.rollout_id)
    old_activity_ended = time.time()
    await asyncio.sleep(0.5)
    busy_started = time.time()
    await backend.register_attempt("busy", "0")
    expired = await backend.expire_idle_rollouts(_idle_s_between(old_activity_ended, busy_started))
    assert sorted(expired, key=str) == [("idle", "0"), ("records-only", None)]
    idle = await backend.get_attempt("0", "idle")
    assert idle is not None and idle.status is AttemptStatus.TIMED_OUT and "idle timeout" in (idle.error or "")
    statuses = {r.rollout_id: r.status for r in await backend.list_rollouts()}
    assert statuses == {
        "idle": RolloutStatus.TIMED_OUT,
        "records-only": RolloutStatus.TIMED_OUT,
        "runner": RolloutStatus.RUNNING,
        "busy": RolloutStatus.RUNNING,
    }
    busy_registered = time.time()
    await asyncio.sleep(0.5)
    activity = time.time()
    await backend.add_llm_call(call("busy", "0"))  # activity keeps it alive, though it was registered long ago
    assert await backend.expire_idle_rollouts(_idle_s_between(busy_registered, activity)) == []
    with pytest.raises(ValueError, match="idle_s"):
        await backend.expire_idle_rollouts(0)


async def test_consumption_marks_and_list_filters(backend: Store) -> None:
    before = time.time()
    for rid, is_eval in (("a", False), ("b", False), ("e", True)):
        await backend.register_attempt(rid, "0", RolloutTask(task_id="t", eval=is_eval))
        await backend.complete_attempt(rid, "0", AttemptStatus.SUCCEEDED)
    assert await backend.mark_consumed(["a", "e"], 3) == 2
    assert await backend.mark_consumed(["a", "b"], 4) == 1  # a was taken already
    fresh = await backend.list_rollouts(consumed=False, eval=False, created_since=before)
    assert fresh == []
    assert [r.rollout_id for r in await backend.list_rollouts(eval=True)] == ["e"]
    assert (await backend.get_rollout("b")).consumed_step == 4  # type: ignore[union-attr]
    assert await backend.release_consumed(3) == 1  # resuming from step 3 forgets what step 4 took
    assert [r.rollout_id for r in await backend.list_rollouts(consumed=False)] == ["b"]
    assert await backend.list_rollouts(created_since=time.time() + 60) == []


async def test_wait_for_change_wakes_on_a_state_change_and_times_out_otherwise(backend: Store) -> None:
    began = time.monotonic()
    assert await backend.wait_for_change(0.3) is False
    assert 0.25 <= time.monotonic() - began < 2.0

    async def finish_soon() -> None:
        await asyncio.sleep(0.1)
        await backend.register_attempt("w", "0")

    waker = asyncio.create_task(finish_soon())
    began = time.monotonic()
    assert await backend.wait_for_change(10.0) is True
    assert time.monotonic() - began < 5.0
    await waker


async def test_a_change_between_a_token_and_the_wait_is_not_missed(backend: Store) -> None:
    token = await backend.change_token()
    await backend.register_attempt("between", "0")  # after the caller's read, before it waits
    began = time.monotonic()
    assert await backend.wait_for_change(10.0, since=token) is True
    assert time.monotonic() - began < 1.0
    token = await backend.change_token()
    assert await backend.wait_for_change(0.3, since=token) is False  # nothing since: it still waits
