"""Opening files: schema version checks, foreign files, permissions, pragmas."""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from agl_bridge.store import SCHEMA_VERSION, SQLiteStore, StoreSchemaError
from agl_bridge.store.schema import VERSION_TABLE
from agl_bridge.types import CallClass, LLMCall
from agl_bridge.viewer.db import ReadOnlyStore


def set_version(path: Path, version: int) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute(f"UPDATE {VERSION_TABLE} SET version = ?", (version,))


async def test_new_file_is_private_and_in_wal_mode(tmp_path: Path, make_call: Callable[..., LLMCall]) -> None:
    path = tmp_path / "nested" / "dir" / "store.db"
    old_umask = os.umask(0o022)  # the usual umask would give 0644
    try:
        async with SQLiteStore(path) as store:
            await store.add_llm_call(make_call())
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            assert stat.S_IMODE(os.stat(f"{path}-wal").st_mode) == 0o600
    finally:
        os.umask(old_umask)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute(f"SELECT version FROM {VERSION_TABLE}").fetchone() == (SCHEMA_VERSION,)


async def test_reopening_keeps_the_data(tmp_path: Path, make_call: Callable[..., LLMCall]) -> None:
    path = tmp_path / "s.db"
    async with SQLiteStore(path) as store:
        rollout = await store.create_rollout({"q": 1})
        await store.add_llm_call(make_call())
    async with SQLiteStore(path) as store:
        assert (await store.get_rollout(rollout.rollout_id)) == rollout
        assert len([c async for c in store.iter_llm_calls()]) == 1


@pytest.mark.parametrize(("found", "advice"), [(SCHEMA_VERSION + 1, "upgrade agl_bridge"), (0, "older agl_bridge")])
async def test_other_schema_version_is_refused_with_both_versions_named(
    tmp_path: Path, found: int, advice: str
) -> None:
    path = tmp_path / "s.db"
    async with SQLiteStore(path):
        pass
    set_version(path, found)
    with pytest.raises(StoreSchemaError) as info:
        await SQLiteStore(path).open()
    message = str(info.value)
    assert f"schema version {found}" in message and f"expects version {SCHEMA_VERSION}" in message
    assert advice in message and str(path) in message


async def test_foreign_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER)")
    with pytest.raises(StoreSchemaError, match="not an agl_bridge store"):
        await SQLiteStore(path).open()
    with sqlite3.connect(path) as conn:  # and left untouched
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("invoices",)]


async def test_non_database_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are not the pages you are looking for" * 200)
    with pytest.raises(StoreSchemaError, match="is not a SQLite database"):
        await SQLiteStore(path).open()


def test_in_memory_path_and_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="needs a file path"):
        SQLiteStore(":memory:")
    with pytest.raises(ValueError, match="synchronous must be one of"):
        SQLiteStore("x.db", synchronous="OFF")


_V1_TABLES = """
CREATE TABLE agl_schema_version (version INTEGER NOT NULL, created_at REAL NOT NULL, created_by TEXT NOT NULL);
CREATE TABLE rollouts (rollout_id TEXT PRIMARY KEY, group_id TEXT, status TEXT NOT NULL, task TEXT NOT NULL,
    metadata TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE attempts (attempt_id TEXT PRIMARY KEY, rollout_id TEXT NOT NULL REFERENCES rollouts(rollout_id),
    number INTEGER NOT NULL, status TEXT NOT NULL, error TEXT, traceback TEXT, started_at REAL NOT NULL,
    ended_at REAL, UNIQUE (rollout_id, number));
CREATE TABLE sequences (rollout_key TEXT NOT NULL, attempt_key TEXT NOT NULL, next INTEGER NOT NULL,
    PRIMARY KEY (rollout_key, attempt_key)) WITHOUT ROWID;
CREATE TABLE llm_calls (id INTEGER PRIMARY KEY, rollout_key TEXT NOT NULL, attempt_key TEXT NOT NULL,
    sequence INTEGER NOT NULL, choice_index INTEGER NOT NULL, kind TEXT NOT NULL, model TEXT NOT NULL,
    prompt_token_ids BLOB NOT NULL, response_token_ids BLOB NOT NULL, response_logprobs BLOB NOT NULL,
    token_policy_versions BLOB NOT NULL, policy_version INTEGER, messages TEXT NOT NULL, response_text TEXT,
    finish_reason TEXT, agent_name TEXT, started_at REAL, ended_at REAL, prefix_breaks TEXT NOT NULL, span_id TEXT,
    trace_id TEXT, input_tokens INTEGER, output_tokens INTEGER);
INSERT INTO agl_schema_version VALUES (1, 0, 'agl_bridge 0.1');
INSERT INTO llm_calls VALUES (1, 'ro-1', 'at-1', 0, 0, 'text', 'judge', x'', x'', x'', x'', NULL, '[]', 'ok',
    'stop', NULL, 1.0, 2.0, '[]', NULL, NULL, NULL, NULL);
INSERT INTO rollouts VALUES ('ro-1', 'g', 'succeeded', '{"q": 1}', '{}', 1, 1.0, 2.0);
INSERT INTO attempts VALUES ('at-1', 'ro-1', 1, 'succeeded', NULL, NULL, 1.0, 2.0);
INSERT INTO sequences VALUES ('ro-1', 'at-1', 2), ('ext', '0', 1), ('', '', 5);
"""


async def test_a_version_1_store_is_upgraded_in_place_and_its_unregistered_rollouts_registered(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(_V1_TABLES)
    async with SQLiteStore(path) as store:
        kept = await store.get_rollout("ro-1")
        assert kept is not None and (kept.status.value, kept.origin.value, kept.task) == (
            "succeeded",
            "runner",
            {"q": 1},
        )
        assert [a.attempt_id for a in await store.list_attempts("ro-1")] == ["at-1"]
        (kept_call,) = [c async for c in store.iter_llm_calls("ro-1")]
        assert (kept_call.model, kept_call.response_text, kept_call.declared_class) == ("judge", "ok", None)
        registered = await store.get_rollout("ext")  # it had records but no row: visible now
        assert registered is not None and (registered.origin.value, registered.attempts) == ("external", 1)
    with sqlite3.connect(path) as conn:
        version, created_by = conn.execute(f"SELECT version, created_by FROM {VERSION_TABLE}").fetchone()
    assert version == SCHEMA_VERSION == 3 and "upgraded to 2" in created_by and "upgraded to 3" in created_by


async def test_a_version_2_store_is_upgraded_in_place_keeping_its_calls(
    tmp_path: Path, make_call: Callable[..., LLMCall]
) -> None:
    path = tmp_path / "v2.db"
    async with SQLiteStore(path) as store:
        await store.add_llm_call(make_call())
        await store.add_llm_call(make_call(prompt_token_ids=[7, 8]))
    with sqlite3.connect(path) as conn:  # back to version 2's layout: the three columns were added last
        conn.execute("ALTER TABLE llm_calls DROP COLUMN declared_class")
        conn.execute("ALTER TABLE llm_calls DROP COLUMN declared_parent")
        conn.execute("ALTER TABLE llm_calls DROP COLUMN carries")
        conn.execute(f"UPDATE {VERSION_TABLE} SET version = 2, created_by = 'agl_bridge 0.2'")
    with pytest.raises(StoreSchemaError, match=r"upgraded in place.*agl-bridge inspect --store"):
        ReadOnlyStore(path)  # a read-only opener cannot upgrade it; it says how
    async with SQLiteStore(path) as store:
        kept = [c async for c in store.iter_llm_calls("ro-1", "at-1")]
        assert [(c.prompt_token_ids, c.messages, c.declared_class, c.declared_parent) for c in kept] == [
            ([1, 2, 3], [{"role": "user", "content": "hi"}], None, None),
            ([7, 8], [{"role": "user", "content": "hi"}], None, None),
        ]
        await store.add_llm_call(make_call(declared_class=CallClass.COMPACTION, declared_parent="1"))
        (last,) = [c async for c in store.iter_llm_calls("ro-1", "at-1")][2:]
        assert (last.sequence, last.declared_class, last.declared_parent) == (2, CallClass.COMPACTION, "1")
    with sqlite3.connect(path) as conn:
        version, created_by = conn.execute(f"SELECT version, created_by FROM {VERSION_TABLE}").fetchone()
    assert version == 3 and created_by.startswith("agl_bridge 0.2; upgraded to 3 by ")
    ReadOnlyStore(path).close()  # and now it opens read-only too
