"""Reading a store read-only: never writing, never blocking a writer, live changes, bad files, metrics."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from viewer_helpers import KEY, build_store, call

from agl_bridge.store import SQLiteStore
from agl_bridge.store.errors import StoreSchemaError
from agl_bridge.store.export import NoStoreError
from agl_bridge.store.schema import VERSION_TABLE
from agl_bridge.types import AttemptStatus, Reward
from agl_bridge.viewer.app import Viewer, create_app
from agl_bridge.viewer.db import ReadOnlyStore
from agl_bridge.viewer.run_dir import MetricsLog


@pytest.fixture
def fresh_store(tmp_path: Path) -> Path:
    """A scenario store of the test's own (these tests write to it)."""
    path = tmp_path / "store.sqlite"
    asyncio.run(build_store(path))
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_browsing_never_changes_the_store(fresh_store: Path) -> None:
    before = digest(fresh_store)
    viewer = Viewer(fresh_store)
    try:
        client = TestClient(create_app(viewer, key=KEY, port=0), headers={"authorization": f"Bearer {KEY}"})
        for url in ("/", "/rollouts", "/rollouts/ro-a2", "/rollouts/ro-a3?view=tokens", "/groups/s0-0", "/steps/1"):
            assert client.get(url).status_code == 200
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            viewer.store.connection().execute("DELETE FROM rollouts")
    finally:
        viewer.close()
    assert digest(fresh_store) == before


def test_reads_go_on_while_a_writer_holds_the_write_lock(fresh_store: Path) -> None:
    writer = sqlite3.connect(fresh_store, isolation_level=None)
    viewer = Viewer(fresh_store)
    try:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("UPDATE rollouts SET updated_at = updated_at + 1")
        client = TestClient(create_app(viewer, key=KEY, port=0), headers={"authorization": f"Bearer {KEY}"})
        assert client.get("/rollouts/ro-a1").status_code == 200  # no wait on the writer's lock
        writer.execute("UPDATE rollouts SET updated_at = updated_at + 1")  # and the writer is not blocked by us
        writer.execute("COMMIT")
    finally:
        writer.close()
        viewer.close()


def test_new_records_show_up_in_the_live_version_and_fragments(fresh_store: Path) -> None:
    viewer = Viewer(fresh_store)
    try:
        client = TestClient(create_app(viewer, key=KEY, port=0), headers={"authorization": f"Bearer {KEY}"})
        version = client.get("/api/version").json()
        assert client.get("/api/version").json() == version  # nothing written: no change

        async def write() -> None:
            async with SQLiteStore(fresh_store) as store:
                await store.create_rollout({"word": "late"}, group_id="s1-0", rollout_id="ro-late")
                attempt = (await store.start_attempt("ro-late")).attempt_id
                await store.add_llm_call(call("ro-late", attempt, [3, 2, 1], [77], response_text="arrived late"))

        asyncio.run(write())
        assert client.get("/api/version").json() != version
        assert 'data-rollout="ro-late"' in client.get("/rollouts?fragment=1").text
        fragment = client.get("/rollouts/ro-late?fragment=1").text
        assert "arrived late" in fragment and "<html" not in fragment
    finally:
        viewer.close()


def test_timeline_pages_keep_every_choice_of_a_call_together(tmp_path: Path) -> None:
    async def build() -> str:
        async with SQLiteStore(tmp_path / "long.sqlite") as store:
            await store.create_rollout("long", rollout_id="ro-long")
            attempt = (await store.start_attempt("ro-long")).attempt_id
            for turn in range(60):
                await store.add_llm_call(call("ro-long", attempt, [1, turn], [2], response_text=f"turn {turn}"))
            # Two choices of one request share a sequence; they straddle the first page's end.
            sequence = await store.next_sequence("ro-long", attempt)
            choices = [call("ro-long", attempt, [1], [3], sequence=sequence, choice_index=i) for i in (0, 1)]
            await store.add_llm_calls(choices)
            await store.add_reward(Reward(rollout_id="ro-long", attempt_id=attempt, value=1.0))
            await store.finish_attempt(attempt, AttemptStatus.SUCCEEDED)
            return attempt

    attempt = asyncio.run(build())
    viewer = Viewer(tmp_path / "long.sqlite")
    try:
        from agl_bridge.viewer.timeline import timeline_page

        with viewer.store.snapshot() as conn:
            pages, after = [], -1
            while True:
                page = timeline_page(conn, "ro-long", attempt, after, size=25)
                pages.append(page)
                if page.next_after is None:
                    break
                after = page.next_after
        seen = [(item.sequence, item.call.call.choice_index if item.call else -1) for p in pages for item in p.items]
        assert seen == [(s, 0) for s in range(60)] + [(60, 0), (60, 1), (61, -1)]
        assert all(len(p.items) <= 25 for p in pages)
    finally:
        viewer.close()


def test_a_missing_or_empty_path_or_a_directory_is_not_a_store(tmp_path: Path) -> None:
    (tmp_path / "empty.sqlite").touch()
    for path, words in (
        (tmp_path / "missing.sqlite", "no store at"),
        (tmp_path / "empty.sqlite", "is an empty file"),
        (tmp_path, "is a directory"),
    ):
        with pytest.raises(NoStoreError, match=words):
            ReadOnlyStore(path)
    assert not (tmp_path / "missing.sqlite").exists()  # nothing was created


def test_a_file_that_is_not_sqlite_or_not_ours_is_refused_in_one_line(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("these are notes, not a database\n" * 100)
    with pytest.raises(StoreSchemaError) as caught:
        ReadOnlyStore(text)
    assert "is not an agl_bridge store (not a SQLite database" in str(caught.value) and "\n" not in str(caught.value)
    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE things (x)")
    with pytest.raises(StoreSchemaError, match="is a SQLite database but not an agl_bridge store"):
        ReadOnlyStore(foreign)


def test_another_schema_version_gets_the_stores_own_message(fresh_store: Path) -> None:
    with sqlite3.connect(fresh_store) as conn:
        conn.execute(f"UPDATE {VERSION_TABLE} SET version = 99")

    async def open_for_writing() -> None:
        async with SQLiteStore(fresh_store):
            pass

    with pytest.raises(StoreSchemaError) as written:
        asyncio.run(open_for_writing())
    with pytest.raises(StoreSchemaError) as read:
        ReadOnlyStore(fresh_store)
    assert str(read.value) == str(written.value) and "schema version 99" in str(read.value)


def test_metrics_log_skips_a_torn_line_and_rereads_a_rewritten_file(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path)
    assert log.records() == [] and log.version() == "none"
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"phase": "train", "step": 1, "loss": 1.0}) + "\n" + '{"phase": "train", "st')
    assert [r["step"] for r in log.records()] == [1]
    first = log.version()
    path.write_text(
        "".join(json.dumps({"phase": "train", "step": s, "loss": 1.0 / s}) + "\n" for s in (1, 2, 2))
    )  # a resume ran step 2 again
    assert log.version() != first
    assert [r["step"] for r in log.train_records()] == [1, 2]
