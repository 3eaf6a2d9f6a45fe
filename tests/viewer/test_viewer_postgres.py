"""The viewer on a PostgreSQL store: the same pages as on the same records in SQLite, read-only, live.

The scenario store (`build_store`) is written into a SQLite file and a PostgreSQL database with
replayable ids and clock, so both hold identical records; every page (lists with each filter and
sort, rollouts, tokens, groups, steps, a call) must then render the same HTML but for the store's
name. Skips, saying why, where no PostgreSQL server can be started.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from shared_helpers import replayable_stores
from starlette.testclient import TestClient
from viewer_helpers import KEY, build_store, call, write_run_dir

from agl_bridge.store import store_at
from agl_bridge.store.errors import NoStoreError, StoreError
from agl_bridge.viewer.app import Viewer, create_app
from agl_bridge.viewer.pg_db import glob_to_regex
from agl_bridge.viewer.run_dir import run_store

PAGES = (
    "/",
    "/rollouts",
    "/rollouts?sort=return",
    "/rollouts?sort=return&order=asc",
    "/rollouts?sort=calls",
    "/rollouts?sort=duration",
    "/rollouts?sort=status&order=asc",
    "/rollouts?min=0.5",
    "/rollouts?max=0.3",
    "/rollouts?kind=train",
    "/rollouts?kind=eval",
    "/rollouts?q=al",
    "/rollouts?q=%25",
    "/rollouts?model=tiny",
    "/rollouts?step=1",
    "/rollouts?status=running",
    "/rollouts/ro-a2",
    "/rollouts/ro-a3",
    "/rollouts/ro-a3?view=tokens",
    "/rollouts/ro-solo",
    "/rollouts/ro-solo?attempt=outside",
    "/groups/s0-0",
    "/groups/s0-1",
    "/steps/1",
    "/steps/2",
    "/compare?a=ro-a1&b=ro-a2",
    "/rollouts/ro-a1/calls/0?attempt=at-000000",
)


@pytest.fixture
def both(tmp_path: Path, postgres_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Viewer, Viewer]]:
    """Viewers (with a run directory) on the scenario written into SQLite and into PostgreSQL."""
    sqlite = tmp_path / "store.sqlite"
    for location in (sqlite, postgres_dsn):
        replayable_stores(monkeypatch)
        asyncio.run(build_store(location))
    run_dir = write_run_dir(tmp_path / "run")
    viewers = (Viewer(sqlite, run_dir), Viewer(postgres_dsn, run_dir))
    try:
        yield viewers
    finally:
        for viewer in viewers:
            viewer.close()


def without_clock(page: str) -> str:
    """A page with its wall-clock times blanked: a reward's default timestamp is read from the clock itself."""
    return re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "(time)", page)


def client(viewer: Viewer) -> TestClient:
    return TestClient(create_app(viewer, key=KEY, port=0), headers={"authorization": f"Bearer {KEY}"})


def test_every_page_of_a_postgresql_store_is_the_page_of_the_same_sqlite_store(both: tuple[Viewer, Viewer]) -> None:
    on_sqlite, on_postgres = both
    sqlite_client, postgres_client = client(on_sqlite), client(on_postgres)
    for url in PAGES:
        expected, got = sqlite_client.get(url), postgres_client.get(url)
        assert expected.status_code == 200, (url, expected.text[-500:])
        assert got.status_code == 200, (url, got.text[-500:])
        text = got.text.replace(on_postgres.store.where, on_sqlite.store.where)
        assert without_clock(text) == without_clock(expected.text), url


def test_the_postgresql_viewer_reads_live_and_never_writes(both: tuple[Viewer, Viewer], postgres_dsn: str) -> None:
    _, viewer = both
    browser = client(viewer)
    version = browser.get("/api/version").json()
    assert browser.get("/api/version").json() == version  # nothing written: no change
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):  # the session itself is read-only
        viewer.store.connection().execute("DELETE FROM rollouts")
    with pytest.raises(StoreError, match="read-only transaction"), viewer.store.snapshot() as conn:
        conn.execute("DELETE FROM rollouts")

    async def write() -> None:
        async with store_at(postgres_dsn) as store:
            await store.create_rollout({"word": "late"}, group_id="s1-0", rollout_id="ro-late")
            attempt = (await store.start_attempt("ro-late")).attempt_id
            await store.add_llm_call(call("ro-late", attempt, [3, 2, 1], [77], response_text="arrived late"))

    asyncio.run(write())
    moved = browser.get("/api/version").json()
    assert moved["store"] != version["store"]
    assert 'data-rollout="ro-late"' in browser.get("/rollouts?fragment=1").text
    assert "arrived late" in browser.get("/rollouts/ro-late?fragment=1").text

    async def reward() -> None:  # a record that changes no rollout still moves the stamp
        async with store_at(postgres_dsn) as store:
            from agl_bridge.types import Reward

            await store.add_reward(Reward(rollout_id="ro-late", value=0.5))

    asyncio.run(reward())
    assert browser.get("/api/version").json()["store"] != moved["store"]


def test_a_database_without_a_store_is_refused(postgres_server) -> None:
    empty = postgres_server.create_schema("viewer_empty")
    with pytest.raises(NoStoreError, match="holds no agl_bridge store"):
        Viewer(empty)


def test_glob_patterns_become_anchored_regular_expressions() -> None:
    assert glob_to_regex("s[0-9]*-[0-9]*") == "^s[0-9].*\\-[0-9].*$"
    assert glob_to_regex("eval?.x") == "^eval.\\.x$"


def test_a_run_that_recorded_into_postgresql_is_viewed_from_its_run_dir(tmp_path: Path) -> None:
    url = "postgresql://agl@db.example:5432/runs"
    (tmp_path / "config.json").write_text(json.dumps({"store": url, "model": "tiny"}))
    assert run_store(tmp_path) == url
    (tmp_path / "config.json").write_text(json.dumps({"store": None}))
    assert run_store(tmp_path) == str(tmp_path / "store.sqlite")
    assert run_store(tmp_path / "missing") == str(tmp_path / "missing" / "store.sqlite")
