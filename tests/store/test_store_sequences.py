"""Sequence allocation: unique and monotonic per (rollout, attempt) under concurrency."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agl_bridge.store import SQLiteStore


async def test_concurrent_allocation_is_unique_and_monotonic_per_attempt(store: SQLiteStore) -> None:
    attempts = [("ro-1", "at-1"), ("ro-1", "at-2"), ("ro-2", "at-1"), (None, None)]

    async def allocate(task_index: int) -> tuple[tuple[str | None, str | None], list[int]]:
        key = attempts[task_index % len(attempts)]
        got = []
        for _ in range(20):
            got.append(await store.next_sequence(*key))
            await asyncio.sleep(0)
        return key, got

    results = await asyncio.gather(*(allocate(i) for i in range(64)))
    per_key: dict[tuple[str | None, str | None], list[int]] = {}
    for key, got in results:
        assert got == sorted(got) and len(set(got)) == len(got), f"not increasing within one task: {got}"
        per_key.setdefault(key, []).extend(got)
    for key, numbers in per_key.items():
        assert sorted(numbers) == list(range(16 * 20)), f"duplicates or gaps for {key}"
    assert store.write_stats["batches"] < store.write_stats["ops"], "concurrent allocations were never batched"


async def test_two_store_objects_on_one_file_never_hand_out_the_same_number(tmp_path: Path) -> None:
    # Two store objects are two connections, as two processes would have.
    path = tmp_path / "shared.db"
    async with SQLiteStore(path) as first, SQLiteStore(path) as second:
        numbers = await asyncio.gather(*(s.next_sequence("ro-1", "at-1") for _ in range(50) for s in (first, second)))
    assert sorted(numbers) == list(range(100))


async def test_sequences_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SQLiteStore(path) as store:
        assert [await store.next_sequence("ro-1", "at-1") for _ in range(3)] == [0, 1, 2]
    async with SQLiteStore(path) as store:
        assert await store.next_sequence("ro-1", "at-1") == 3
