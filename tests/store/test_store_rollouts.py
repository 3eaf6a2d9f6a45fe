"""Rollouts and attempts: creation, the status state machine, attempts, and queries."""

from __future__ import annotations

import pytest

from agl_bridge.store import (
    AttemptNotFoundError,
    InvalidTransitionError,
    RolloutNotFoundError,
    SQLiteStore,
)
from agl_bridge.types import AttemptStatus, RolloutStatus


async def test_create_and_get_rollout(store: SQLiteStore) -> None:
    created = await store.create_rollout({"question": "2+2?", "answer": 4}, group_id="g1", metadata={"split": "train"})
    assert created.status is RolloutStatus.QUEUED and created.attempts == 0
    assert created.rollout_id.startswith("ro-")
    assert await store.get_rollout(created.rollout_id) == created
    assert await store.get_rollout("ro-missing") is None


async def test_store_made_ids_sort_by_creation(store: SQLiteStore) -> None:
    ids = [(await store.create_rollout(i)).rollout_id for i in range(5)]
    assert len(set(ids)) == 5
    assert ids[0] <= ids[-1]


async def test_rollout_id_and_task_are_validated(store: SQLiteStore) -> None:
    await store.create_rollout("t", rollout_id="ro-mine")
    with pytest.raises(ValueError, match="'ro-mine' already exists"):
        await store.create_rollout("t", rollout_id="ro-mine")
    with pytest.raises(ValueError, match="appears in URL"):
        await store.create_rollout("t", rollout_id="has/slash")
    with pytest.raises(ValueError, match="task must be JSON-serializable"):
        await store.create_rollout({"f": float("nan")})


async def test_legal_path_to_success(store: SQLiteStore) -> None:
    rollout = await store.create_rollout("t")
    running = await store.set_rollout_status(rollout.rollout_id, RolloutStatus.RUNNING)
    assert running.status is RolloutStatus.RUNNING and running.updated_at >= rollout.updated_at
    done = await store.set_rollout_status(rollout.rollout_id, RolloutStatus.SUCCEEDED)
    assert (await store.get_rollout(rollout.rollout_id)) == done


@pytest.mark.parametrize(
    ("path", "illegal"),
    [
        ([], RolloutStatus.SUCCEEDED),
        ([], RolloutStatus.QUEUED),
        ([RolloutStatus.RUNNING], RolloutStatus.RUNNING),
        ([RolloutStatus.RUNNING, RolloutStatus.FAILED], RolloutStatus.RUNNING),
        ([RolloutStatus.RUNNING, RolloutStatus.TIMED_OUT], RolloutStatus.SUCCEEDED),
        ([RolloutStatus.RUNNING, RolloutStatus.SUCCEEDED], RolloutStatus.QUEUED),
    ],
)
async def test_illegal_transition_names_both_states_and_changes_nothing(
    store: SQLiteStore, path: list[RolloutStatus], illegal: RolloutStatus
) -> None:
    rollout = await store.create_rollout("t")
    for status in path:
        await store.set_rollout_status(rollout.rollout_id, status)
    before = await store.get_rollout(rollout.rollout_id)
    assert before is not None
    with pytest.raises(InvalidTransitionError) as info:
        await store.set_rollout_status(rollout.rollout_id, illegal)
    assert f"from {before.status.value!r} to {illegal.value!r}" in str(info.value)
    assert await store.get_rollout(rollout.rollout_id) == before


async def test_running_rollout_can_be_requeued_for_a_retry(store: SQLiteStore) -> None:
    rollout = await store.create_rollout("t")
    await store.set_rollout_status(rollout.rollout_id, RolloutStatus.RUNNING)
    requeued = await store.set_rollout_status(rollout.rollout_id, RolloutStatus.QUEUED)
    assert requeued.status is RolloutStatus.QUEUED


async def test_unknown_ids_raise_not_found(store: SQLiteStore) -> None:
    with pytest.raises(RolloutNotFoundError, match="ro-nope"):
        await store.set_rollout_status("ro-nope", RolloutStatus.RUNNING)
    with pytest.raises(RolloutNotFoundError):
        await store.start_attempt("ro-nope")
    with pytest.raises(AttemptNotFoundError, match="at-nope"):
        await store.finish_attempt("at-nope", AttemptStatus.FAILED)


async def test_attempts_number_up_and_record_their_outcome(store: SQLiteStore) -> None:
    rollout = await store.create_rollout("t")
    first = await store.start_attempt(rollout.rollout_id)
    assert (first.number, first.status) == (1, AttemptStatus.RUNNING)
    assert (await store.get_rollout(rollout.rollout_id)).status is RolloutStatus.RUNNING  # type: ignore[union-attr]
    failed = await store.finish_attempt(first.attempt_id, AttemptStatus.FAILED, error="boom", traceback="Traceback ...")
    assert (failed.status, failed.error, failed.traceback) == (AttemptStatus.FAILED, "boom", "Traceback ...")
    assert failed.ended_at is not None
    second = await store.start_attempt(rollout.rollout_id)  # retry while the rollout is running
    assert second.number == 2 and second.attempt_id != first.attempt_id
    assert (await store.get_rollout(rollout.rollout_id)).attempts == 2  # type: ignore[union-attr]
    listed = await store.list_attempts(rollout.rollout_id)
    assert [a.attempt_id for a in listed] == [first.attempt_id, second.attempt_id]
    assert await store.get_attempt(second.attempt_id) == second


async def test_attempt_rules(store: SQLiteStore) -> None:
    rollout = await store.create_rollout("t")
    attempt = await store.start_attempt(rollout.rollout_id)
    with pytest.raises(ValueError, match="needs a final status"):
        await store.finish_attempt(attempt.attempt_id, AttemptStatus.RUNNING)
    await store.finish_attempt(attempt.attempt_id, AttemptStatus.SUCCEEDED)
    with pytest.raises(InvalidTransitionError, match="from 'succeeded' to 'failed'"):
        await store.finish_attempt(attempt.attempt_id, AttemptStatus.FAILED)
    await store.set_rollout_status(rollout.rollout_id, RolloutStatus.SUCCEEDED)
    with pytest.raises(InvalidTransitionError, match="starting an attempt"):
        await store.start_attempt(rollout.rollout_id)


async def test_list_rollouts_filters_by_status_and_group(store: SQLiteStore) -> None:
    a = await store.create_rollout("a", group_id="g1")
    b = await store.create_rollout("b", group_id="g1")
    c = await store.create_rollout("c", group_id="g2")
    await store.set_rollout_status(b.rollout_id, RolloutStatus.RUNNING)
    ids = lambda rollouts: [r.rollout_id for r in rollouts]  # noqa: E731
    assert ids(await store.list_rollouts()) == [a.rollout_id, b.rollout_id, c.rollout_id]
    assert ids(await store.list_rollouts(group_id="g1")) == [a.rollout_id, b.rollout_id]
    assert ids(await store.list_rollouts(status=RolloutStatus.QUEUED)) == [a.rollout_id, c.rollout_id]
    assert ids(await store.list_rollouts(status=[RolloutStatus.RUNNING], group_id="g1")) == [b.rollout_id]
    assert ids(await store.list_rollouts(status=RolloutStatus.QUEUED, limit=1)) == [a.rollout_id]
    assert await store.list_rollouts(status=[]) == []
