"""Store rows → the store's own records (`Rollout`, `Attempt`, `LLMCall`, `Reward`, `StoredSpan`), read-only.

The column lists and decoders are the store's (`agl_bridge.store.sqlite_rows`), so what the viewer
shows is exactly what `SQLiteStore` (or `PostgresStore`) would hand the converter or an export. `conn`
is a sqlite3 connection or the viewer's `PostgresConnection` (`pg_db.py`: same SQL, same rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from agl_bridge.store.base import group_rollout_records
from agl_bridge.store.codec import decode_json
from agl_bridge.store.postgres_writer import RESPONSE_TEXT_INDEX, from_pg_call_row
from agl_bridge.store.sqlite_rows import (
    ATTEMPT_SELECT,
    LLM_CALL_SELECT,
    NO_ID,
    REWARD_SELECT,
    ROLLOUT_SELECT,
    SPAN_SELECT,
    TOKEN_CALL_SELECT,
    decode_attempt,
    decode_reward,
    decode_rollout,
    decode_span,
    decode_token_call,
)
from agl_bridge.store.sqlite_rows import decode_llm_call as decode_call_row
from agl_bridge.types import Attempt, LLMCall, Reward, Rollout, RolloutRecords, StoredSpan


def decode_llm_call(row: Sequence[Any]) -> LLMCall:
    """The store's `decode_llm_call` of a row of either backend (PostgreSQL keeps the response text as bytes)."""
    if isinstance(row[RESPONSE_TEXT_INDEX], (bytes, memoryview)):
        row = from_pg_call_row(row)
    return decode_call_row(row)


class Reader(Protocol):
    """A connection the pages read through: sqlite3's, or `pg_db.PostgresConnection` (the same SQL on PostgreSQL)."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Any:
        """Run one query with `?` placeholders; a cursor (fetchone, fetchall, iteration over tuples)."""
        ...


def marks(values: Sequence[Any]) -> str:
    """`?, ?, ?` for an IN list of `values`."""
    return ", ".join("?" for _ in values)


def get_rollouts(conn: Reader, rollout_ids: Sequence[str]) -> dict[str, Rollout]:
    """The rollouts of `rollout_ids` that exist, by id."""
    if not rollout_ids:
        return {}
    rows = conn.execute(
        f"SELECT {ROLLOUT_SELECT} FROM rollouts WHERE rollout_id IN ({marks(rollout_ids)})", list(rollout_ids)
    ).fetchall()
    return {row[0]: decode_rollout(row) for row in rows}


def get_attempts(conn: Reader, rollout_ids: Sequence[str]) -> dict[str, list[Attempt]]:
    """The attempts of each rollout, by number."""
    if not rollout_ids:
        return {}
    rows = conn.execute(
        f"SELECT {ATTEMPT_SELECT} FROM attempts WHERE rollout_id IN ({marks(rollout_ids)}) ORDER BY rollout_id, number",
        list(rollout_ids),
    ).fetchall()
    attempts: dict[str, list[Attempt]] = {}
    for row in rows:
        attempts.setdefault(row[0], []).append(decode_attempt(row))
    return attempts


def rollout_records(conn: Reader, rollout_ids: Sequence[str], *, tokens_only: bool = True) -> list[RolloutRecords]:
    """The records of the given (existing) rollouts, as the store's `iter_rollout_records` bundles them."""
    rollouts = get_rollouts(conn, rollout_ids)
    ids = [rollout_id for rollout_id in dict.fromkeys(rollout_ids) if rollout_id in rollouts]
    if not ids:
        return []
    attempts = get_attempts(conn, ids)
    select, decode_call = (TOKEN_CALL_SELECT, decode_token_call) if tokens_only else (LLM_CALL_SELECT, decode_llm_call)
    calls: dict[str, list[LLMCall]] = {}
    for row in conn.execute(
        f"SELECT {select} FROM llm_calls WHERE rollout_key IN ({marks(ids)}) "
        "ORDER BY rollout_key, attempt_key, sequence, choice_index",
        ids,
    ):
        calls.setdefault(row[0], []).append(decode_call(row))
    rewards: dict[str, list[Reward]] = {}
    for row in conn.execute(
        f"SELECT {REWARD_SELECT} FROM rewards WHERE rollout_key IN ({marks(ids)}) "
        "ORDER BY rollout_key, attempt_key, sequence",
        ids,
    ):
        rewards.setdefault(row[0], []).append(decode_reward(row))
    return [group_rollout_records(rollouts[i], attempts.get(i, []), calls.get(i, []), rewards.get(i, [])) for i in ids]


def attempt_key(attempt_id: str | None) -> str:
    """The stored attempt key (records outside any attempt: the empty key)."""
    return attempt_id or NO_ID


def _rows_after(
    conn: Reader, table: str, select: str, rollout_id: str, attempt_id: str | None, after: int, limit: int
) -> list[Any]:
    order = "sequence, choice_index" if table == "llm_calls" else "sequence"
    return conn.execute(
        f"SELECT {select} FROM {table} WHERE rollout_key = ? AND attempt_key = ? AND sequence > ? "
        f"ORDER BY {order} LIMIT ?",
        (rollout_id, attempt_key(attempt_id), after, limit),
    ).fetchall()


def calls_after(conn: Reader, rollout_id: str, attempt_id: str | None, after: int, limit: int) -> list[LLMCall]:
    """Up to `limit` calls of one attempt with sequence > `after`, in (sequence, choice) order."""
    rows = _rows_after(conn, "llm_calls", LLM_CALL_SELECT, rollout_id, attempt_id, after, limit)
    return [decode_llm_call(row) for row in rows]


def rewards_after(conn: Reader, rollout_id: str, attempt_id: str | None, after: int, limit: int) -> list[Reward]:
    """Up to `limit` rewards of one attempt with sequence > `after`."""
    return [
        decode_reward(row) for row in _rows_after(conn, "rewards", REWARD_SELECT, rollout_id, attempt_id, after, limit)
    ]


def spans_after(conn: Reader, rollout_id: str, attempt_id: str | None, after: int, limit: int) -> list[StoredSpan]:
    """Up to `limit` generic spans of one attempt with sequence > `after`."""
    rows = _rows_after(conn, "spans", SPAN_SELECT, rollout_id, attempt_id, after, limit)
    return [decode_span(row) for row in rows]


def previous_call_messages(
    conn: Reader, rollout_id: str, attempt_id: str | None, before: int
) -> list[dict[str, Any]] | None:
    """The messages of the last call of an attempt with sequence <= `before`, or None."""
    row = conn.execute(
        "SELECT messages FROM llm_calls WHERE rollout_key = ? AND attempt_key = ? AND sequence <= ? "
        "ORDER BY sequence DESC, choice_index LIMIT 1",
        (rollout_id, attempt_key(attempt_id), before),
    ).fetchone()
    return None if row is None else decode_json(row[0])


def get_call(conn: Reader, rollout_id: str, attempt_id: str | None, sequence: int, choice: int) -> LLMCall | None:
    """One call by its place, or None."""
    row = conn.execute(
        f"SELECT {LLM_CALL_SELECT} FROM llm_calls WHERE rollout_key = ? AND attempt_key = ? AND sequence = ? "
        "AND choice_index = ?",
        (rollout_id, attempt_key(attempt_id), sequence, choice),
    ).fetchone()
    return None if row is None else decode_llm_call(row)


def record_counts(conn: Reader, rollout_id: str, attempt_id: str | None) -> tuple[int, int, int]:
    """(calls, rewards, spans) of one attempt."""
    key = (rollout_id, attempt_key(attempt_id))
    where = "WHERE rollout_key = ? AND attempt_key = ?"
    return (
        conn.execute(f"SELECT count(*) FROM llm_calls {where}", key).fetchone()[0],
        conn.execute(f"SELECT count(*) FROM rewards {where}", key).fetchone()[0],
        conn.execute(f"SELECT count(*) FROM spans {where}", key).fetchone()[0],
    )
