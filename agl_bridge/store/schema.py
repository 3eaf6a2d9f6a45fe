"""The SQLite schema of a store file, its version, and the check done when a file is opened.

Layout notes:
  - `rollout_key` / `attempt_key` hold the rollout and attempt ids, with '' standing for "none":
    calls made outside any rollout share the ('', '') sequence space. Using '' instead of NULL
    keeps the ordering indexes unique (SQLite treats NULLs as distinct in unique indexes).
  - Records carry no foreign key to `rollouts`: spans may arrive for rollouts this store did not
    create (an external runner), and refusing them would lose data (invariant 4).
  - The unique ordering indexes double as the "indexes on rollout, attempt, sequence" and give
    streaming reads their order; the partial unique index on `span_id` makes re-delivered spans
    (an exporter retrying after a lost response) a no-op instead of a duplicate.
  - `sequences.next` is always greater than every sequence stored for its key.
  - `spans` holds every other span received (agent, tool and framework spans), in the same
    sequence space as the calls and rewards of its (rollout, attempt). Its `span_id` is NOT NULL,
    yet its unique index is partial like the others so one upsert clause fits all three tables.
  - Every record under a (rollout, attempt) the store has no row for registers that rollout and
    attempt as running (`origin` 'external') in the transaction that writes it, so every rollout
    the proxy saw is listed (version 2). Attempt ids are unique per rollout, not store-wide: an
    outside harness may name every rollout's attempt "0". `sequences.touched_at` is when a record
    last arrived under that key: the idle timeout reads it, at no extra statement per record.
  - `consumed_step` marks the rollouts a follow trainer took (partial index: the few not yet taken).
  - `llm_calls.declared_class` / `declared_parent` hold what the agent declared for the call
    (headers `x-agl-call-class` / `x-agl-parent-call`; NULL when it declared nothing), and `carries`
    the earlier calls whose answer the request carried (a JSON list; NULL for none) (version 3).

Older files are upgraded in place when a writer opens them: version 1 through 2 (`_upgrade_from_1`),
version 2 to 3 (`_upgrade_from_2`).
"""

from __future__ import annotations

import sqlite3
import time

from agl_bridge.store.rollout_rules import register_key

SCHEMA_VERSION = 3
"""Bump when the layout changes; files of another version are refused with StoreSchemaError."""

UPGRADABLE_VERSIONS = (1, 2)
"""Older versions a writer upgrades in place on open (read-only openers refuse them, saying so)."""

VERSION_TABLE = "agl_schema_version"

_ATTEMPTS_DDL = """
CREATE TABLE attempts (
    rollout_id TEXT NOT NULL REFERENCES rollouts(rollout_id),
    attempt_id TEXT NOT NULL,
    number INTEGER NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    traceback TEXT,
    started_at REAL NOT NULL,
    ended_at REAL,
    PRIMARY KEY (rollout_id, attempt_id),
    UNIQUE (rollout_id, number)
);
CREATE INDEX attempts_id ON attempts(attempt_id);
CREATE INDEX attempts_running ON attempts(rollout_id) WHERE status = 'running'
"""

_DDL = f"""
CREATE TABLE {VERSION_TABLE} (
    version INTEGER NOT NULL,
    created_at REAL NOT NULL,
    created_by TEXT NOT NULL
);

CREATE TABLE rollouts (
    rollout_id TEXT PRIMARY KEY,
    group_id TEXT,
    status TEXT NOT NULL,
    task TEXT NOT NULL,
    metadata TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    origin TEXT NOT NULL DEFAULT 'runner',
    eval INTEGER NOT NULL DEFAULT 0,
    consumed_step INTEGER
);
CREATE INDEX rollouts_status ON rollouts(status);
CREATE INDEX rollouts_group ON rollouts(group_id);
CREATE INDEX rollouts_unconsumed ON rollouts(created_at) WHERE consumed_step IS NULL;

{_ATTEMPTS_DDL};

CREATE TABLE sequences (
    rollout_key TEXT NOT NULL,
    attempt_key TEXT NOT NULL,
    next INTEGER NOT NULL,
    touched_at REAL,
    PRIMARY KEY (rollout_key, attempt_key)
) WITHOUT ROWID;

CREATE TABLE llm_calls (
    id INTEGER PRIMARY KEY,
    rollout_key TEXT NOT NULL,
    attempt_key TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    choice_index INTEGER NOT NULL,
    kind TEXT NOT NULL,
    model TEXT NOT NULL,
    prompt_token_ids BLOB NOT NULL,
    response_token_ids BLOB NOT NULL,
    response_logprobs BLOB NOT NULL,
    token_policy_versions BLOB NOT NULL,
    policy_version INTEGER,
    messages TEXT NOT NULL,
    response_text TEXT,
    finish_reason TEXT,
    agent_name TEXT,
    started_at REAL,
    ended_at REAL,
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
    id INTEGER PRIMARY KEY,
    rollout_key TEXT NOT NULL,
    attempt_key TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    name TEXT NOT NULL,
    value REAL NOT NULL,
    timestamp REAL NOT NULL,
    span_id TEXT,
    trace_id TEXT
);
CREATE UNIQUE INDEX rewards_order ON rewards(rollout_key, attempt_key, sequence);
CREATE UNIQUE INDEX rewards_span ON rewards(span_id) WHERE span_id IS NOT NULL;

CREATE TABLE spans (
    id INTEGER PRIMARY KEY,
    rollout_key TEXT NOT NULL,
    attempt_key TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    name TEXT NOT NULL,
    trace_id TEXT NOT NULL,
    span_id TEXT NOT NULL,
    parent_span_id TEXT,
    kind TEXT NOT NULL,
    start_time_ns INTEGER NOT NULL,
    end_time_ns INTEGER NOT NULL,
    attributes TEXT NOT NULL,
    resource TEXT NOT NULL,
    scope_name TEXT,
    status TEXT NOT NULL,
    status_message TEXT
);
CREATE UNIQUE INDEX spans_order ON spans(rollout_key, attempt_key, sequence);
CREATE UNIQUE INDEX spans_span ON spans(span_id) WHERE span_id IS NOT NULL;
"""


class SchemaMismatch(Exception):
    """Internal: the file is not a store of SCHEMA_VERSION; the message is user-facing."""


def ensure_schema(conn: sqlite3.Connection, path: str, created_by: str) -> None:
    """Create the schema in an empty file, or check the version of an existing store.

    Runs in one IMMEDIATE transaction so that two processes opening a new file at once cannot both
    create it. Raises SchemaMismatch with a message naming the found and expected versions.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            # executescript() would commit the open transaction, so run the statements one by one.
            for statement in _DDL.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(
                f"INSERT INTO {VERSION_TABLE} (version, created_at, created_by) VALUES (?, ?, ?)",
                (SCHEMA_VERSION, time.time(), created_by),
            )
        elif (found := _stored_version(conn, tables)) in UPGRADABLE_VERSIONS:
            if found == 1:
                _upgrade_from_1(conn, created_by)
            _upgrade_from_2(conn, created_by)
        else:
            _check_version(conn, path, tables)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _stored_version(conn: sqlite3.Connection, tables: set[str]) -> int | None:
    if VERSION_TABLE not in tables:
        return None
    row = conn.execute(f"SELECT version FROM {VERSION_TABLE}").fetchone()
    return None if row is None else int(row[0])


def _upgrade_from_1(conn: sqlite3.Connection, created_by: str) -> None:
    """Version 1 → 2 inside the caller's transaction: the new columns, attempts keyed per rollout,
    and every (rollout, attempt) that has records but no row registered, as version 2 would have."""
    for statement in (
        "ALTER TABLE rollouts ADD COLUMN origin TEXT NOT NULL DEFAULT 'runner'",
        "ALTER TABLE rollouts ADD COLUMN eval INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE rollouts ADD COLUMN consumed_step INTEGER",
        "CREATE INDEX rollouts_unconsumed ON rollouts(created_at) WHERE consumed_step IS NULL",
        "ALTER TABLE sequences ADD COLUMN touched_at REAL",
        "ALTER TABLE attempts RENAME TO attempts_v1",
        *(part for part in _ATTEMPTS_DDL.split(";") if part.strip()),
        "INSERT INTO attempts (rollout_id, attempt_id, number, status, error, traceback, started_at, ended_at) "
        "SELECT rollout_id, attempt_id, number, status, error, traceback, started_at, ended_at FROM attempts_v1",
        "DROP TABLE attempts_v1",
    ):
        conn.execute(statement)
    now = time.time()
    for rollout_key, attempt_key in conn.execute(
        "SELECT rollout_key, attempt_key FROM sequences WHERE rollout_key != ''"
    ).fetchall():
        register_key(conn, rollout_key, attempt_key, now)
    conn.execute(
        f"UPDATE {VERSION_TABLE} SET version = ?, created_by = created_by || ?", (2, f"; upgraded to 2 by {created_by}")
    )


_ADDED_IN_3 = (
    "ALTER TABLE llm_calls ADD COLUMN declared_class TEXT",
    "ALTER TABLE llm_calls ADD COLUMN declared_parent TEXT",
    "ALTER TABLE llm_calls ADD COLUMN carries TEXT",
)
"""Version 2 → 3: the call's declared class and parent (NULL for every call recorded before: nothing declared)."""


def _upgrade_from_2(conn: sqlite3.Connection, created_by: str) -> None:
    """Version 2 → 3 inside the caller's transaction: the declared class and parent of a call."""
    for statement in _ADDED_IN_3:
        conn.execute(statement)
    conn.execute(
        f"UPDATE {VERSION_TABLE} SET version = ?, created_by = created_by || ?", (3, f"; upgraded to 3 by {created_by}")
    )


def check_schema(conn: sqlite3.Connection, path: str) -> None:
    """Check the version of an existing store without writing (for read-only openers); SchemaMismatch if not ours."""
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    _check_version(conn, path, tables)


def _check_version(conn: sqlite3.Connection, path: str, tables: set[str]) -> None:
    if VERSION_TABLE not in tables:
        raise SchemaMismatch(
            f"{path} is a SQLite database but not an agl_bridge store (it has tables "
            f"{sorted(tables)[:5]} and no {VERSION_TABLE} table); point the store at a new file "
            "or at a file agl_bridge created"
        )
    row = conn.execute(f"SELECT version, created_by FROM {VERSION_TABLE}").fetchone()
    if row is None:
        raise SchemaMismatch(f"{path} has an empty {VERSION_TABLE} table; the file is damaged; use a new file")
    found, created_by = row
    if found == SCHEMA_VERSION:
        return
    if found in UPGRADABLE_VERSIONS:
        advice = (
            f"it was written by an older agl_bridge ({created_by}) and is upgraded in place when opened for "
            f"writing: run `agl-bridge inspect --store {path}` once, then retry"
        )
    elif found < SCHEMA_VERSION:
        advice = (
            f"it was written by an older agl_bridge ({created_by}); read or export it with that "
            "version, or start a new store file"
        )
    else:
        advice = f"it was written by a newer agl_bridge ({created_by}); upgrade agl_bridge to open it"
    raise SchemaMismatch(
        f"store {path} has schema version {found} but this agl_bridge expects version {SCHEMA_VERSION}; {advice}"
    )
