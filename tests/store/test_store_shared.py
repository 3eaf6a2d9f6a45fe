"""One store object serves every event loop and thread of a process (one writer connection per process).

A training process runs the proxy on a loop of its own and the trainer on another; both use the
proxy's store. Here the loop that opened the store is blocked outright while another thread's loop
writes and reads: that other loop must not need the owner's loop for anything.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from agl_bridge.store import SQLiteStore, StoreClosedError
from agl_bridge.store.base import Store
from agl_bridge.types import AttemptStatus, Reward, RolloutStatus

GUARD_S = 60.0  # only bounds a hang of a broken build; a working store answers in milliseconds


def _run_in_thread(work: Any) -> dict[str, Any]:
    """Run the coroutine function `work` on a new loop in a new thread; block this thread until it ends."""
    box: dict[str, Any] = {}

    def main() -> None:
        try:
            box["result"] = asyncio.run(work())
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=main)
    thread.start()
    thread.join(GUARD_S)  # blocks the caller's loop on purpose
    assert not thread.is_alive(), "the other loop's store calls hung while the store's own loop was blocked"
    if "error" in box:
        raise box["error"]
    return box


async def test_another_loop_writes_and_reads_while_the_owning_loop_is_blocked(store: Store) -> None:
    async def trainer_side() -> tuple[Any, ...]:
        rollout = await store.create_rollout({"q": 1}, group_id="g")
        attempt = await store.start_attempt(rollout.rollout_id)
        sequences = await store.add_rewards(
            [Reward(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, value=v) for v in (0.5, 1.0)]
        )
        await store.finish_attempt(attempt.attempt_id, AttemptStatus.SUCCEEDED)
        ended = await store.set_rollout_status(rollout.rollout_id, RolloutStatus.SUCCEEDED)
        rewards = [r.value async for r in store.iter_rewards(rollout.rollout_id)]
        (records,) = [r async for r in store.iter_rollout_records([rollout.rollout_id])]
        return ended.status, sequences, rewards, len(records.attempts)

    status, sequences, rewards, attempts = _run_in_thread(trainer_side)["result"]
    assert status is RolloutStatus.SUCCEEDED
    assert sequences == sorted(sequences) and len(set(sequences)) == 2
    assert rewards == [0.5, 1.0] and attempts == 1
    # The owning loop sees what the other loop wrote, and keeps writing to the same sequence space.
    (rollout,) = await store.list_rollouts(group_id="g")
    assert await store.next_sequence(rollout.rollout_id, None) >= 0


async def test_a_write_from_another_loop_after_close_is_refused(store_path: Any) -> None:
    store = SQLiteStore(store_path)
    await store.open()
    await store.close()

    async def late() -> None:
        await store.create_rollout({"q": 1})

    with pytest.raises(StoreClosedError):
        _run_in_thread(late)


async def test_writes_of_another_loop_are_committed_before_close_returns(store_path: Any) -> None:
    async with SQLiteStore(store_path) as store:
        started = threading.Event()
        box: dict[str, Any] = {}

        def other() -> None:
            async def write() -> list[int]:
                rewards = [Reward(rollout_id="ro-1", attempt_id="at-1", value=float(i)) for i in range(50)]
                pending = asyncio.ensure_future(store.add_rewards(rewards))
                await asyncio.sleep(0)  # queued on the writer thread now
                started.set()
                return await pending

            box["sequences"] = asyncio.run(write())

        thread = threading.Thread(target=other)
        thread.start()
        assert await asyncio.to_thread(started.wait, GUARD_S)
    thread.join(GUARD_S)
    assert box["sequences"] == list(range(50))
    async with SQLiteStore(store_path) as reopened:
        assert len([r async for r in reopened.iter_rewards("ro-1")]) == 50


async def test_another_loop_may_write_more_at_once_than_the_pending_bound(store_path: Any) -> None:
    async with SQLiteStore(store_path, max_pending=4) as store:

        async def many() -> list[int]:
            return await store.add_rewards(
                [Reward(rollout_id="ro-1", attempt_id="at-1", value=float(i)) for i in range(20)]
            )

        assert _run_in_thread(many)["result"] == list(range(20))
