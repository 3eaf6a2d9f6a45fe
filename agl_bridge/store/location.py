"""Where a store lives: a SQLite file path or a PostgreSQL URL (`--store` / `store =`), and the store for it."""

from __future__ import annotations

import os

from agl_bridge.store.postgres import PostgresStore, is_postgres_location
from agl_bridge.store.sqlite import SQLiteStore

__all__ = ["StoreLocation", "describe_location", "is_postgres_location", "store_at"]

StoreLocation = str | os.PathLike[str]
"""A SQLite file path, or a `postgresql://…` / `postgres://…` URL."""


def store_at(location: StoreLocation) -> SQLiteStore | PostgresStore:
    """The (unopened) store at `location`: a PostgresStore for a PostgreSQL URL, else a SQLiteStore file."""
    if is_postgres_location(location):
        return PostgresStore(str(location))
    return SQLiteStore(location)


def describe_location(location: StoreLocation) -> str:
    """How messages name a store location (a PostgreSQL URL without its password)."""
    if is_postgres_location(location):
        from agl_bridge.store.postgres_writer import describe_dsn

        return describe_dsn(str(location))
    return str(location)
