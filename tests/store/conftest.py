"""The store tests' `store` fixture: an open store of each backend (SQLite file, PostgreSQL database).

Tests here that take `store` run on both backends; the PostgreSQL run skips, saying why, where no
server can be started. Tests of one backend's own behaviour build that store themselves.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agl_bridge.store import PostgresStore, SQLiteStore


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, store_path: Path) -> AsyncIterator[SQLiteStore | PostgresStore]:
    """An open store on the test's event loop, closed after the test: each backend in turn."""
    if request.param == "sqlite":
        opened: SQLiteStore | PostgresStore = SQLiteStore(store_path)
    else:
        opened = PostgresStore(request.getfixturevalue("postgres_dsn"))
    async with opened:
        yield opened
