"""The rollout and attempt state machine as SQL, run inside a store's write transaction, by every backend.

Each function reads the current state and writes the new one inside the writer's open
transaction, which makes check-then-update atomic even with several processes writing: SQLite's
writer holds the file's write lock (BEGIN IMMEDIATE); PostgreSQL's holds the store's state lock (an
advisory transaction lock every state-changing batch takes first, `postgres_writer.py`). The SQL
is the dialect both share, with `?` placeholders (the PostgreSQL writer's connection adapter turns
them into `%s`); a connection is anything with `execute(sql, params)` returning a cursor
(`SqlConnection`).

Rollouts we do not launch (origin 'external') live by these rules:
  - `register_key` (`register_keys`: a batch's keys at once): the first record under a (rollout,
    attempt) the store has no row for registers the rollout (running) and the attempt (running,
    next number), in the transaction of the record;
    an attempt new to a finished rollout is not registered (its records stay visible, never trained);
  - `register_attempt` (a harness's start request) does the same and names the task, refusing a
    finished attempt or rollout (`AttemptFinishedError`) and another task (`TaskConflictError`);
  - `complete_attempt` finishes an attempt, and its rollout once no attempt of it is running:
    succeeded if any attempt succeeded, else this attempt's outcome (`settle_rollout`);
  - `expire_idle` times out the running external attempts with no record or request for a while.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from agl_bridge.store.codec import encode_json
from agl_bridge.store.errors import AttemptFinishedError, AttemptNotFoundError, RolloutNotFoundError, TaskConflictError
from agl_bridge.store.sqlite_rows import ATTEMPT_SELECT, ROLLOUT_SELECT, decode_attempt, decode_rollout
from agl_bridge.types import (
    Attempt,
    AttemptStatus,
    InvalidTransitionError,
    Rollout,
    RolloutOrigin,
    RolloutStatus,
    RolloutTask,
)


class SqlCursor(Protocol):
    """What the rules read from a statement: its rows and how many rows it changed."""

    @property
    def rowcount(self) -> int:
        """Rows the statement changed."""
        ...

    def fetchone(self) -> Any:
        """The next row, or None."""
        ...

    def fetchall(self) -> list[Any]:
        """Every remaining row."""
        ...


class SqlConnection(Protocol):
    """A connection inside an open write transaction (sqlite3's, or the PostgreSQL writer's adapter)."""

    def execute(self, sql: str, parameters: Any = ..., /) -> SqlCursor:
        """Run one statement with `?` placeholders."""
        ...


_FINAL = tuple(status.value for status in RolloutStatus if status.is_final)
_EXTERNAL = RolloutOrigin.EXTERNAL.value
_RUNNING = AttemptStatus.RUNNING.value


def create_rollout(
    conn: SqlConnection,
    rollout_id: str,
    task_json: str,
    group_id: str | None,
    metadata_json: str,
    now: float,
) -> Rollout:
    """Insert a queued rollout; ValueError if the id is taken."""
    inserted = conn.execute(
        "INSERT INTO rollouts (rollout_id, group_id, status, task, metadata, attempts, created_at, updated_at) "
        "VALUES (?, ?, ?, ?, ?, 0, ?, ?) ON CONFLICT (rollout_id) DO NOTHING",
        (rollout_id, group_id, RolloutStatus.QUEUED.value, task_json, metadata_json, now, now),
    ).rowcount
    if not inserted:
        raise ValueError(
            f"a rollout with id {rollout_id!r} already exists; pick another id or leave it out to get a fresh one"
        ) from None
    return load_rollout(conn, rollout_id)


def set_rollout_status(conn: SqlConnection, rollout_id: str, status: RolloutStatus, now: float) -> Rollout:
    """Move a rollout to `status`; InvalidTransitionError naming both statuses if illegal."""
    current = _current_rollout_status(conn, rollout_id)
    current.check_transition(status, rollout_id)
    conn.execute("UPDATE rollouts SET status = ?, updated_at = ? WHERE rollout_id = ?", (status.value, now, rollout_id))
    return load_rollout(conn, rollout_id)


def start_attempt(conn: SqlConnection, rollout_id: str, attempt_id: str, now: float) -> Attempt:
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
    return load_attempt(conn, rollout_id, attempt_id)


def finish_attempt(
    conn: SqlConnection,
    attempt_id: str,
    status: AttemptStatus,
    error: str | None,
    traceback: str | None,
    now: float,
    rollout_id: str | None = None,
) -> Attempt:
    """Close a running attempt with its outcome; the rollout's status is left to the caller."""
    rollout_id = find_attempt(conn, attempt_id, rollout_id)
    current = _attempt_status(conn, rollout_id, attempt_id)
    if current is not AttemptStatus.RUNNING:
        raise InvalidTransitionError(f"attempt {attempt_id!r}", current.value, status.value, ())
    _close_attempt(conn, rollout_id, attempt_id, status, error, traceback, now)
    conn.execute("UPDATE rollouts SET updated_at = ? WHERE rollout_id = ?", (now, rollout_id))
    return load_attempt(conn, rollout_id, attempt_id)


def find_attempt(conn: SqlConnection, attempt_id: str, rollout_id: str | None) -> str:
    """The rollout of an attempt: `rollout_id` if it has that attempt, else the one rollout that does.

    AttemptNotFoundError if none has it; ValueError if several do and no rollout was named (attempt
    ids are unique per rollout only, and outside harnesses often reuse them).
    """
    if rollout_id is not None:
        if conn.execute(
            "SELECT 1 FROM attempts WHERE rollout_id = ? AND attempt_id = ?", (rollout_id, attempt_id)
        ).fetchone():
            return rollout_id
        raise AttemptNotFoundError(attempt_id, rollout_id)
    rows = conn.execute("SELECT rollout_id FROM attempts WHERE attempt_id = ? LIMIT 2", (attempt_id,)).fetchall()
    if not rows:
        raise AttemptNotFoundError(attempt_id)
    if len(rows) > 1:
        raise ValueError(
            f"attempt id {attempt_id!r} is used by several rollouts; name the rollout too (rollout_id=...)"
        )
    return str(rows[0][0])


def register_key(conn: SqlConnection, rollout_id: str, attempt_id: str, now: float) -> None:
    """Register the rollout and attempt of a record written under a key new to the store (module doc).

    `attempt_id` "" is a record of the rollout outside any attempt: only the rollout is registered.
    """
    register_keys(conn, [(rollout_id, attempt_id)], now)


_KEYS_PER_STATEMENT = 500
"""Keys one registration statement names (at most 6 placeholders each: well inside both engines' limits)."""


def register_keys(conn: SqlConnection, keys: Sequence[tuple[str, str]], now: float) -> None:
    """`register_key` for every (rollout, attempt) of `keys` at once: the state read in one or two statements,
    the new rows written in one per table.

    A writer's batch registers all its new keys together: under load every request may start a
    rollout, and five statements per key were most of a batch's round trips. The rules, in key
    order: a rollout no row holds yet is registered (running, external); an attempt new to an
    external rollout that is not finished gets its rollout's next number, and the rollout is
    running again and counts it. The runner starts its rollouts' attempts itself: a record naming
    another attempt of one is not one of its runs, and stays outside them. A new rollout is written
    with its attempts counted, so only rollouts that existed are updated.
    """
    ordered = sorted(set(keys))
    for first in range(0, len(ordered), _KEYS_PER_STATEMENT):
        chunk = ordered[first : first + _KEYS_PER_STATEMENT]
        rollout_ids = list(dict.fromkeys(rollout_id for rollout_id, _ in chunk))
        marks = ", ".join("?" for _ in rollout_ids)
        known = {
            rollout_id: (status, attempts, origin)
            for rollout_id, status, attempts, origin in conn.execute(
                f"SELECT rollout_id, status, attempts, origin FROM rollouts WHERE rollout_id IN ({marks})", rollout_ids
            ).fetchall()
        }
        open_ = {r for r, (status, _, origin) in known.items() if origin == _EXTERNAL and status not in _FINAL}
        wanted = [(r, a) for r, a in chunk if a and (r not in known or r in open_)]
        if any(r in known for r, _ in wanted):
            have = [r for r in rollout_ids if r in open_]
            listed = ", ".join("?" for _ in have)
            taken = set(
                conn.execute(
                    f"SELECT rollout_id, attempt_id FROM attempts WHERE rollout_id IN ({listed})", have
                ).fetchall()
            )
            wanted = [key for key in wanted if key not in taken]
        counts = {rollout_id: known[rollout_id][1] if rollout_id in known else 0 for rollout_id in rollout_ids}
        numbered = []
        for rollout_id, attempt_id in wanted:
            counts[rollout_id] += 1
            numbered.append((attempt_id, rollout_id, counts[rollout_id], _RUNNING, now))
        new = [(r, RolloutStatus.RUNNING.value, counts[r], now, now, _EXTERNAL) for r in rollout_ids if r not in known]
        if new:
            conn.execute(
                "INSERT INTO rollouts (rollout_id, group_id, status, task, metadata, attempts, created_at, updated_at, "
                "origin) VALUES " + ", ".join("(?, NULL, ?, 'null', '{}', ?, ?, ?, ?)" for _ in new),
                [value for row in new for value in row],
            )
        if numbered:
            conn.execute(
                "INSERT INTO attempts (attempt_id, rollout_id, number, status, started_at) VALUES "
                + ", ".join("(?, ?, ?, ?, ?)" for _ in numbered),
                [value for row in numbered for value in row],
            )
        for rollout_id in dict.fromkeys(r for _, r, _, _, _ in numbered):
            if rollout_id in known:
                conn.execute(
                    "UPDATE rollouts SET status = ?, attempts = ?, updated_at = ? WHERE rollout_id = ?",
                    (RolloutStatus.RUNNING.value, counts[rollout_id], now, rollout_id),
                )


def check_open(conn: SqlConnection, rollout_id: str, attempt_id: str, refused: str) -> None:
    """Raise AttemptFinishedError (ending with `refused`) unless (rollout, attempt) is live: its attempt
    is running, or is new and its rollout is not finished."""
    row = conn.execute(
        "SELECT status FROM attempts WHERE rollout_id = ? AND attempt_id = ?", (rollout_id, attempt_id)
    ).fetchone()
    if row is not None:
        if row[0] != _RUNNING:
            raise AttemptFinishedError(
                f"attempt {attempt_id!r} of rollout {rollout_id!r} is already finished ({row[0]}); {refused}"
            )
        return
    status = conn.execute("SELECT status FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()
    if status is not None and status[0] in _FINAL:
        raise AttemptFinishedError(
            f"rollout {rollout_id!r} is already finished ({status[0]}); a new attempt {attempt_id!r} cannot start "
            "under it: run the task again under a new rollout id"
        )


def register_attempt(
    conn: SqlConnection, rollout_id: str, attempt_id: str, task: RolloutTask | None, now: float
) -> Rollout:
    """A harness starts (rollout, attempt), naming its task: registered as running if new (module doc)."""
    check_open(conn, rollout_id, attempt_id, "it cannot start again: run the task again under a new rollout id")
    register_key(conn, rollout_id, attempt_id, now)
    name_task(conn, rollout_id, task, now)
    return load_rollout(conn, rollout_id)


def name_task(conn: SqlConnection, rollout_id: str, task: RolloutTask | None, now: float) -> None:
    """Record the task a rollout works on (its group), its metadata and eval flag; TaskConflictError if another."""
    if task is None:
        return
    row = conn.execute("SELECT group_id, task FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()
    if row is None:
        raise RolloutNotFoundError(rollout_id)
    group_id, stored_task = row
    if task.task_id is not None:
        if group_id is not None and group_id != task.task_id:
            raise TaskConflictError(
                f"rollout {rollout_id!r} belongs to task {group_id!r}, not {task.task_id!r}; a rollout id names "
                "one run of one task: use a new rollout id for each run"
            )
        group_id = task.task_id
        if task.metadata is None and stored_task == "null":
            stored_task = encode_json("task_id", task.task_id)
    if task.metadata is not None:
        stored_task = encode_json("metadata", task.metadata)
    assignments = "group_id = ?, task = ?, updated_at = ?" + ("" if task.eval is None else ", eval = ?")
    values: list[object] = [group_id, stored_task, now] + ([] if task.eval is None else [int(task.eval)])
    conn.execute(f"UPDATE rollouts SET {assignments} WHERE rollout_id = ?", (*values, rollout_id))


def complete_attempt(
    conn: SqlConnection,
    rollout_id: str,
    attempt_id: str,
    status: AttemptStatus,
    error: str | None,
    task: RolloutTask | None,
    now: float,
) -> Rollout:
    """Finish a running attempt with its outcome (naming its task first), then settle its rollout."""
    current = conn.execute(
        "SELECT status FROM attempts WHERE rollout_id = ? AND attempt_id = ?", (rollout_id, attempt_id)
    ).fetchone()
    if current is None:
        raise AttemptNotFoundError(attempt_id, rollout_id)
    if current[0] != _RUNNING:
        raise AttemptFinishedError(
            f"attempt {attempt_id!r} of rollout {rollout_id!r} is already finished ({current[0]}); an attempt "
            "is finished once"
        )
    name_task(conn, rollout_id, task, now)
    _close_attempt(conn, rollout_id, attempt_id, status, error, None, now)
    settle_rollout(conn, rollout_id, status, now)
    return load_rollout(conn, rollout_id)


def settle_rollout(conn: SqlConnection, rollout_id: str, outcome: AttemptStatus, now: float) -> None:
    """End a running rollout whose attempts are all finished: succeeded if one succeeded, else `outcome`."""
    row = conn.execute(
        "SELECT status, EXISTS (SELECT 1 FROM attempts WHERE rollout_id = ? AND status = ?), "
        "EXISTS (SELECT 1 FROM attempts WHERE rollout_id = ? AND status = ?) FROM rollouts WHERE rollout_id = ?",
        (rollout_id, _RUNNING, rollout_id, AttemptStatus.SUCCEEDED.value, rollout_id),
    ).fetchone()
    status, any_running, any_succeeded = row
    if status != RolloutStatus.RUNNING.value or any_running:
        return
    final = RolloutStatus.SUCCEEDED if any_succeeded else RolloutStatus(outcome.value)
    conn.execute("UPDATE rollouts SET status = ?, updated_at = ? WHERE rollout_id = ?", (final.value, now, rollout_id))


def expire_idle(conn: SqlConnection, cutoff: float, now: float, error: str) -> list[tuple[str, str | None]]:
    """Time out the external rollouts with nothing recorded or requested since `cutoff`; returns (rollout, attempt)s.

    An attempt's last activity is its start or its newest record (`sequences.touched_at`); a rollout
    registered only by records outside any attempt is timed out as a whole.
    """
    attempts = conn.execute(
        "SELECT a.rollout_id, a.attempt_id FROM attempts a JOIN rollouts r ON r.rollout_id = a.rollout_id "
        "LEFT JOIN sequences s ON s.rollout_key = a.rollout_id AND s.attempt_key = a.attempt_id "
        "WHERE a.status = ? AND r.origin = ? AND a.started_at < ? AND coalesce(s.touched_at, 0) < ?",
        (_RUNNING, _EXTERNAL, cutoff, cutoff),
    ).fetchall()
    for rollout_id, attempt_id in attempts:
        _close_attempt(conn, rollout_id, attempt_id, AttemptStatus.TIMED_OUT, error, None, now)
        settle_rollout(conn, rollout_id, AttemptStatus.TIMED_OUT, now)
    bare = conn.execute(
        "SELECT r.rollout_id FROM rollouts r "
        "LEFT JOIN sequences s ON s.rollout_key = r.rollout_id AND s.attempt_key = '' "
        "WHERE r.status = ? AND r.origin = ? AND r.attempts = 0 AND r.updated_at < ? AND coalesce(s.touched_at, 0) < ?",
        (RolloutStatus.RUNNING.value, _EXTERNAL, cutoff, cutoff),
    ).fetchall()
    for (rollout_id,) in bare:
        conn.execute(
            "UPDATE rollouts SET status = ?, updated_at = ? WHERE rollout_id = ?",
            (RolloutStatus.TIMED_OUT.value, now, rollout_id),
        )
    return [(r, a) for r, a in attempts] + [(r, None) for (r,) in bare]


def mark_consumed(conn: SqlConnection, rollout_ids: Sequence[str], step: int) -> int:
    """Mark rollouts as taken by training step `step` (those not taken already); returns how many."""
    marked = 0
    for rollout_id in rollout_ids:
        marked += conn.execute(
            "UPDATE rollouts SET consumed_step = ? WHERE rollout_id = ? AND consumed_step IS NULL", (step, rollout_id)
        ).rowcount
    return marked


def release_consumed(conn: SqlConnection, after_step: int) -> int:
    """Forget what steps after `after_step` took (a run resumed from that checkpoint); returns how many."""
    return conn.execute("UPDATE rollouts SET consumed_step = NULL WHERE consumed_step > ?", (after_step,)).rowcount


def _attempt_status(conn: SqlConnection, rollout_id: str, attempt_id: str) -> AttemptStatus:
    row = conn.execute(
        "SELECT status FROM attempts WHERE rollout_id = ? AND attempt_id = ?", (rollout_id, attempt_id)
    ).fetchone()
    return AttemptStatus(row[0])


def _close_attempt(
    conn: SqlConnection,
    rollout_id: str,
    attempt_id: str,
    status: AttemptStatus,
    error: str | None,
    traceback: str | None,
    now: float,
) -> None:
    conn.execute(
        "UPDATE attempts SET status = ?, error = ?, traceback = ?, ended_at = ? "
        "WHERE rollout_id = ? AND attempt_id = ?",
        (status.value, error, traceback, now, rollout_id, attempt_id),
    )


def _current_rollout_status(conn: SqlConnection, rollout_id: str) -> RolloutStatus:
    row = conn.execute("SELECT status FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()
    if row is None:
        raise RolloutNotFoundError(rollout_id)
    return RolloutStatus(row[0])


def load_rollout(conn: SqlConnection, rollout_id: str) -> Rollout:
    """The stored rollout (it must exist)."""
    row = conn.execute(f"SELECT {ROLLOUT_SELECT} FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()
    return decode_rollout(row)


def load_attempt(conn: SqlConnection, rollout_id: str, attempt_id: str) -> Attempt:
    """The stored attempt (it must exist)."""
    row = conn.execute(
        f"SELECT {ATTEMPT_SELECT} FROM attempts WHERE rollout_id = ? AND attempt_id = ?", (rollout_id, attempt_id)
    ).fetchone()
    return decode_attempt(row)
