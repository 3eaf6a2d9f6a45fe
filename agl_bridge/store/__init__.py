"""Persistence of rollouts, attempts, LLM calls, rewards and generic spans: the async `Store` API and backends."""

from __future__ import annotations

from agl_bridge.store.base import Store
from agl_bridge.store.errors import (
    AttemptFinishedError,
    AttemptNotFoundError,
    DuplicateRecordError,
    InvalidTransitionError,
    RolloutNotFoundError,
    StoreClosedError,
    StoreConflictError,
    StoreError,
    StoreSchemaError,
    StoreUnavailableError,
    StoreWriteError,
    TaskConflictError,
)
from agl_bridge.store.location import is_postgres_location, store_at
from agl_bridge.store.postgres import PostgresStore
from agl_bridge.store.schema import SCHEMA_VERSION
from agl_bridge.store.sqlite import SQLiteStore

__all__ = [
    "SCHEMA_VERSION",
    "AttemptFinishedError",
    "AttemptNotFoundError",
    "DuplicateRecordError",
    "InvalidTransitionError",
    "PostgresStore",
    "RolloutNotFoundError",
    "SQLiteStore",
    "Store",
    "StoreClosedError",
    "StoreConflictError",
    "StoreError",
    "StoreSchemaError",
    "StoreUnavailableError",
    "StoreWriteError",
    "TaskConflictError",
    "is_postgres_location",
    "store_at",
]
