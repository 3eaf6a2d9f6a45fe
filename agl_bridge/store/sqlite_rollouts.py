"""The rollout and attempt state machine as SQL, run inside the store's write transaction.

Each function reads the current state and writes the new one inside the writer's open IMMEDIATE
transaction, which holds SQLite's write lock, so check-then-update is atomic even with several
processes writing the same file.
"""

from __future__ import annotations

import sqlite3

from agl_bridge.store.errors import AttemptNotFoundError, RolloutNotFoundError
from agl_bridge.store.sqlite_rows import ATTEMPT_SELECT, ROLLOUT_SELECT, decode_attempt, decode_rollout
from agl_bridge.types import Attempt, AttemptStatus, InvalidTransitionError, Rollout, RolloutStatus


def create_rollout(
    conn: sqlite3.Connection,
    rollout_id: str,
    task_json: str,
    group_id: str | None,
    metadata_json: str,
    now: float,
) -> Rollout:
    """Insert a queued rollout; ValueError if the id is taken."""
    try:
        conn.execute(
            "INSERT INTO rollouts (rollout_id, group_id, status, task, metadata, attempts, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, 0, ?, ?)",
            (rollout_id, group_id, RolloutStatus.QUEUED.value, task_json, metadata_json, now, now),
        )
    except sqlite3.IntegrityError:
        raise ValueError(
            f"a rollout with id {rollout_id!r} already exists; pick another id or leave it out to get a fresh one"
        ) from None
    return _load_rollout(conn, rollout_id)


def set_rollout_status(conn: sqlite3.Connection, rollout_id: str, status: RolloutStatus, now: float) -> Rollout:
    """Move a rollout to `status`; InvalidTransitionError naming both statuses if illegal."""
    current = _current_rollout_status(conn, rollout_id)
    current.check_transition(status, rollout_id)
    conn.execute("UPDATE rollouts SET status = ?, updated_at = ? WHERE rollout_id = ?", (status.value, now, rollout_id))
    return _load_rollout(conn, rollout_id)


def start_attempt(conn: sqlite3.Connection, rollout_id: str, attempt_id: str, now: float) -> Attempt:
    """Open the next attempt of a rollout and make the rollout `running` (from queued or running)."""
    current = _current_rollout_status(conn, rollout_id)
    if current is RolloutStatus.QUEUED:
        current.check_transition(RolloutStatus.RUNNING, rollout_id)
    elif current is not RolloutStatus.RUNNING:
        raise InvalidTransitionError(
            f"rollout {rollout_id!r} (starting an attempt)", current.value, RolloutStatus.RUNNING.value, ()
        )
    (attempts,) = conn.execute("SELECT attempts FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()
    number = attempts + 1
    conn.execute(
        "UPDATE rollouts SET status = ?, attempts = ?, updated_at = ? WHERE rollout_id = ?",
        (RolloutStatus.RUNNING.value, number, now, rollout_id),
    )
    conn.execute(
        "INSERT INTO attempts (attempt_id, rollout_id, number, status, started_at) VALUES (?, ?, ?, ?, ?)",
        (attempt_id, rollout_id, number, AttemptStatus.RUNNING.value, now),
    )
    return _load_attempt(conn, attempt_id)


def finish_attempt(
    conn: sqlite3.Connection,
    attempt_id: str,
    status: AttemptStatus,
    error: str | None,
    traceback: str | None,
    now: float,
) -> Attempt:
    """Close a running attempt with its outcome; the rollout's status is left to the caller."""
    row = conn.execute("SELECT status, rollout_id FROM attempts WHERE attempt_id = ?", (attempt_id,)).fetchone()
    if row is None:
        raise AttemptNotFoundError(attempt_id)
    current = AttemptStatus(row[0])
    if current is not AttemptStatus.RUNNING:
        raise InvalidTransitionError(f"attempt {attempt_id!r}", current.value, status.value, ())
    conn.execute(
        "UPDATE attempts SET status = ?, error = ?, traceback = ?, ended_at = ? WHERE attempt_id = ?",
        (status.value, error, traceback, now, attempt_id),
    )
    conn.execute("UPDATE rollouts SET updated_at = ? WHERE rollout_id = ?", (now, row[1]))
    return _load_attempt(conn, attempt_id)


def _current_rollout_status(conn: sqlite3.Connection, rollout_id: str) -> RolloutStatus:
    row = conn.execute("SELECT status FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()
    if row is None:
        raise RolloutNotFoundError(rollout_id)
    return RolloutStatus(row[0])


def _load_rollout(conn: sqlite3.Connection, rollout_id: str) -> Rollout:
    row = conn.execute(f"SELECT {ROLLOUT_SELECT} FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()
    return decode_rollout(row)


def _load_attempt(conn: sqlite3.Connection, attempt_id: str) -> Attempt:
    row = conn.execute(f"SELECT {ATTEMPT_SELECT} FROM attempts WHERE attempt_id = ?", (attempt_id,)).fetchone()
    return decode_attempt(row)
