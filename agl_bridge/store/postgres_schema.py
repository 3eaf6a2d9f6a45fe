"""The PostgreSQL schema of a store database, its version, and the check done when a store connects.

The layout is SQLite's (`schema.py`: the same tables, columns, keys and unique indexes, so the
rules in `rollout_rules.py` and the row codecs in `sqlite_rows.py` serve both), in PostgreSQL's
types: BYTEA for the packed token/logprob arrays, DOUBLE PRECISION for times, BIGINT for numbers.
Differences, and why:
  - every id/key column is `COLLATE "C"`: ordered by code point, as SQLite and Python order
    strings, so the converter's merged streams (ordered by rollout id) line up with Python's `<`;
  - `rollouts.created_order` (an identity column) gives creation order, which SQLite takes from
    its rowid;
  - `llm_calls.response_text` is BYTEA (UTF-8): PostgreSQL's text type cannot hold NUL, which
    models do sample; it round-trips exactly. In the other free text (error messages, tracebacks,
    names) a NUL is stored as U+FFFD (`postgres_writer.pg_text`).
The schema is created in one transaction under an advisory lock, so several proxies starting on
an empty database at once create it once. A version 2 store (PostgreSQL stores began at version 2)
is upgraded to 3 in place under the same lock (`_upgrade_from_2`: the calls' declared class and
parent columns, NULL for the calls already there).
"""

from __future__ import annotations

import time
from typing import Any

from agl_bridge.store.schema import SCHEMA_VERSION, VERSION_TABLE, SchemaMismatch

SCHEMA_LOCK = 0x61676C5F73636800
"""Advisory lock key held while the schema is created or checked ("agl_sch")."""

_ID = 'TEXT COLLATE "C"'

DDL = f"""
CREATE TABLE {VERSION_TABLE} (
    version INTEGER NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    created_by TEXT NOT NULL
);

CREATE TABLE rollouts (
    rollout_id {_ID} PRIMARY KEY,
    group_id {_ID},
    status TEXT NOT NULL,
    task TEXT NOT NULL,
    metadata TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    origin TEXT NOT NULL DEFAULT 'runner',
    eval INTEGER NOT NULL DEFAULT 0,
    consumed_step INTEGER,
    created_order BIGINT GENERATED ALWAYS AS IDENTITY
);
CREATE INDEX rollouts_status ON rollouts(status);
CREATE INDEX rollouts_group ON rollouts(group_id);
CREATE INDEX rollouts_order ON rollouts(created_order);
CREATE INDEX rollouts_unconsumed ON rollouts(created_at) WHERE consumed_step IS NULL;

CREATE TABLE attempts (
    rollout_id {_ID} NOT NULL REFERENCES rollouts(rollout_id),
    attempt_id {_ID} NOT NULL,
    number INTEGER NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    traceback TEXT,
    started_at DOUBLE PRECISION NOT NULL,
    ended_at DOUBLE PRECISION,
    PRIMARY KEY (rollout_id, attempt_id),
    UNIQUE (rollout_id, number)
);
CREATE INDEX attempts_id ON attempts(attempt_id);
CREATE INDEX attempts_running ON attempts(rollout_id) WHERE status = 'running';

CREATE TABLE sequences (
    rollout_key {_ID} NOT NULL,
    attempt_key {_ID} NOT NULL,
    next BIGINT NOT NULL,
    touched_at DOUBLE PRECISION,
    PRIMARY KEY (rollout_key, attempt_key)
);

CREATE TABLE llm_calls (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rollout_key {_ID} NOT NULL,
    attempt_key {_ID} NOT NULL,
    sequence BIGINT NOT NULL,
    choice_index INTEGER NOT NULL,
    kind TEXT NOT NULL,
    model TEXT NOT NULL,
    prompt_token_ids BYTEA NOT NULL,
    response_token_ids BYTEA NOT NULL,
    response_logprobs BYTEA NOT NULL,
    token_policy_versions BYTEA NOT NULL,
    policy_version INTEGER,
    messages TEXT NOT NULL,
    response_text BYTEA,
    finish_reason TEXT,
    agent_name TEXT,
    started_at DOUBLE PRECISION,
    ended_at DOUBLE PRECISION,
    prefix_breaks TEXT NOT NULL,
    span_id TEXT,
    trace_id TEXT,
    input_tokens INTEGER,
    output_tokens INTEGER,
    declared_class TEXT,
    declared_parent TEXT,
    carries TEXT
);
CREATE UNIQUE INDEX llm_calls_order ON llm_calls(rollout_key, attempt_key, sequence, choice_index);
CREATE UNIQUE INDEX llm_calls_span ON llm_calls(span_id) WHERE span_id IS NOT NULL;

CREATE TABLE rewards (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rollout_key {_ID} NOT NULL,
    attempt_key {_ID} NOT NULL,
    sequence BIGINT NOT NULL,
    name TEXT NOT NULL,
    value DOUBLE PRECISION NOT NULL,
    timestamp DOUBLE PRECISION NOT NULL,
    span_id TEXT,
    trace_id TEXT
);
CREATE UNIQUE INDEX rewards_order ON rewards(rollout_key, attempt_key, sequence);
CREATE UNIQUE INDEX rewards_span ON rewards(span_id) WHERE span_id IS NOT NULL;

CREATE TABLE spans (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rollout_key {_ID} NOT NULL,
    attempt_key {_ID} NOT NULL,
    sequence BIGINT NOT NULL,
    name TEXT NOT NULL,
    trace_id TEXT NOT NULL,
    span_id TEXT NOT NULL,
    parent_span_id TEXT,
    kind TEXT NOT NULL,
    start_time_ns BIGINT NOT NULL,
    end_time_ns BIGINT NOT NULL,
    attributes TEXT NOT NULL,
    resource TEXT NOT NULL,
    scope_name TEXT,
    status TEXT NOT NULL,
    status_message TEXT
);
CREATE UNIQUE INDEX spans_order ON spans(rollout_key, attempt_key, sequence);
CREATE UNIQUE INDEX spans_span ON spans(span_id) WHERE span_id IS NOT NULL
"""


def ensure_schema(conn: Any, where: str, created_by: str) -> None:
    """Create the schema in a database without one, or check the version of an existing store.

    `conn` is a psycopg connection (not in a transaction); runs one transaction under SCHEMA_LOCK.
    Raises SchemaMismatch naming the found and expected versions, or a database that holds other
    tables but no store.
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        tables = {
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = current_schema()"
            ).fetchall()
        }
        if not tables:
            for statement in DDL.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(
                f"INSERT INTO {VERSION_TABLE} (version, created_at, created_by) VALUES (%s, %s, %s)",
                (SCHEMA_VERSION, time.time(), created_by),
            )
            return
        if VERSION_TABLE not in tables:
            raise SchemaMismatch(
                f"PostgreSQL database {where} holds tables ({', '.join(sorted(tables)[:5])}) but no agl_bridge "
                f"store (no {VERSION_TABLE} table); point --store at an empty database or at one agl_bridge created"
            )
        row = conn.execute(f"SELECT version, created_by FROM {VERSION_TABLE}").fetchone()
        if row is None:
            raise SchemaMismatch(f"{where} has an empty {VERSION_TABLE} table; the store is damaged; use a new one")
        found, by = row
        if found == SCHEMA_VERSION:
            return
        if found == 2:
            _upgrade_from_2(conn, created_by)
            return
        advice = (
            f"it was written by an older agl_bridge ({by}); read or export it with that version, or use a new database"
            if found < SCHEMA_VERSION
            else f"it was written by a newer agl_bridge ({by}); upgrade agl_bridge to open it"
        )
        raise SchemaMismatch(
            f"store {where} has schema version {found} but this agl_bridge expects version {SCHEMA_VERSION}; {advice}"
        )


def _upgrade_from_2(conn: Any, created_by: str) -> None:
    """Version 2 → 3 inside the caller's transaction (the schema lock held): the declared class and parent."""
    conn.execute(
        "ALTER TABLE llm_calls ADD COLUMN declared_class TEXT, ADD COLUMN declared_parent TEXT, ADD COLUMN carries TEXT"
    )
    upgraded = f"; upgraded to 3 by {created_by}"
    conn.execute(f"UPDATE {VERSION_TABLE} SET version = %s, created_by = created_by || %s", (3, upgraded))
