"""Group commit, durability after an awaited write, backpressure, and write failures."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from shared_helpers import REPO

from agl_bridge.store import SQLiteStore, StoreWriteError
from agl_bridge.types import LLMCall


def count_rows(path: Path, table: str = "llm_calls") -> int:
    """Rows visible to a brand-new, independent connection."""
    with sqlite3.connect(path) as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)  # it reads the file back with sqlite3
async def test_concurrent_writes_are_group_committed_and_visible_once_awaited(
    store: SQLiteStore, store_path: Path, make_call: Callable[..., LLMCall]
) -> None:
    async def write_and_check(index: int) -> None:
        await store.add_llm_call(make_call(attempt_id=f"at-{index}", span_id=f"span-{index}"))
        # The await has returned: the record must be committed, visible to any other connection.
        with sqlite3.connect(store_path) as conn:
            found = conn.execute("SELECT count(*) FROM llm_calls WHERE span_id = ?", (f"span-{index}",)).fetchone()
        assert found == (1,)

    await asyncio.gather(*(write_and_check(i) for i in range(200)))
    stats = store.write_stats
    assert stats["ops"] == 200
    assert stats["batches"] < 100, f"200 concurrent writes took {stats['batches']} transactions"


async def test_awaited_writes_survive_a_process_crash(tmp_path: Path) -> None:
    path = tmp_path / "crash.db"
    script = textwrap.dedent(
        f"""
        import asyncio, os
        from agl_bridge.store import SQLiteStore
        from agl_bridge.types import LLMCall

        async def main():
            store = SQLiteStore({str(path)!r})
            await store.open()
            calls = [LLMCall(rollout_id="ro-1", attempt_id="at-1", model="m", prompt_token_ids=[1],
                             response_token_ids=[2], response_logprobs=[-0.5]) for _ in range(300)]
            await asyncio.gather(*(store.add_llm_call(c) for c in calls))
            print("written", flush=True)
            os._exit(0)  # die without closing: no checkpoint, no cleanup

        asyncio.run(main())
        """
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "written", result.stderr
    assert os.path.exists(f"{path}-wal"), "expected the records to sit in the WAL, not checkpointed"
    async with SQLiteStore(path) as store:
        assert len([c async for c in store.iter_llm_calls("ro-1")]) == 300


async def test_queue_is_bounded_while_the_disk_is_stuck(store_path: Path, make_call: Callable[..., LLMCall]) -> None:
    async with SQLiteStore(store_path, max_pending=8, max_batch=4, busy_timeout_s=30) as store:
        blocker = sqlite3.connect(store_path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # holds the write lock: the writer cannot commit
        try:
            writes = [asyncio.create_task(store.add_llm_call(make_call(attempt_id=f"at-{i}"))) for i in range(60)]
            await asyncio.sleep(0.3)
            assert not any(w.done() for w in writes)
            assert 0 < store.pending_writes <= 8
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        await asyncio.gather(*writes)
        assert store.pending_writes == 0
    assert count_rows(store_path) == 60


async def test_locked_file_gives_a_clear_write_error(store_path: Path, make_call: Callable[..., LLMCall]) -> None:
    async with SQLiteStore(store_path, busy_timeout_s=0.1) as store:
        await store.add_llm_call(make_call(sequence=0))
        blocker = sqlite3.connect(store_path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreWriteError) as info:
                await store.add_llm_call(make_call(sequence=1))
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        message = str(info.value)
        assert str(store_path) in message and "locked" in message and "busy_timeout_s" in message
        # The store keeps working once the lock is gone.
        await store.add_llm_call(make_call(sequence=2))
    assert count_rows(store_path) == 2


async def test_full_disk_gives_a_clear_write_error_and_keeps_the_file_intact(
    store_path: Path, make_call: Callable[..., LLMCall]
) -> None:
    big = make_call(prompt_token_ids=list(range(2000)))
    async with SQLiteStore(store_path, max_db_bytes=400_000) as store:
        stored = 0
        with pytest.raises(StoreWriteError) as info:
            for _ in range(200):
                await store.add_llm_call(big)
                stored += 1
        assert stored > 0
        assert str(store_path) in str(info.value) and "full" in str(info.value)
    with sqlite3.connect(store_path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert count_rows(store_path) == stored


async def test_close_commits_everything_already_submitted(store_path: Path, make_call: Callable[..., LLMCall]) -> None:
    store = SQLiteStore(store_path)
    await store.open()
    writes = [asyncio.create_task(store.add_llm_call(make_call(attempt_id=f"at-{i}"))) for i in range(50)]
    await asyncio.sleep(0)  # let the writes get queued
    await store.close()
    assert all(w.done() and w.exception() is None for w in writes)
    assert count_rows(store_path) == 50
