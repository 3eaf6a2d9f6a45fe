"""The write side of the SQLite store: one connection on one thread, one transaction per batch.

`SQLiteWriter` is used only from the store's single writer thread (`GroupCommitter` runs it). A batch
is applied as: BEGIN IMMEDIATE → state-machine operations (each in a SAVEPOINT, so one illegal
transition fails only its own caller) → sequence allocation (one SELECT of the counters of every
(rollout, attempt) in the batch, one executemany writing them back with the time; a key that had no
counter yet is a (rollout, attempt) seen for the first time, registered as running if the store
has no row for it) → one executemany per record table (LLM calls, rewards, generic spans) → COMMIT.
A batch that changed rollout or attempt state then wakes `wait_for_change` waiters in this process.
If SQLite itself fails (disk full, file
locked past the busy timeout, I/O error) the whole transaction is rolled back and every operation
in the batch fails with `StoreWriteError`; SQLite's journal guarantees the file is never left
half-written.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from agl_bridge.store.errors import (
    AttemptFinishedError,
    DuplicateRecordError,
    StoreError,
    StoreSchemaError,
    StoreWriteError,
)
from agl_bridge.store.group_commit import Failure
from agl_bridge.store.rollout_rules import check_open, register_keys
from agl_bridge.store.schema import SchemaMismatch, ensure_schema
from agl_bridge.store.sqlite_rows import LLM_CALL_COLUMNS, REWARD_COLUMNS, SPAN_COLUMNS

SYNCHRONOUS_MODES = ("NORMAL", "FULL")
MIN_SQLITE = (3, 24, 0)


RecordTable = Literal["llm_calls", "rewards", "spans"]
"""The record tables; each has (rollout_key, attempt_key, sequence) first and a unique span_id."""


@dataclass(slots=True)
class RecordOp:
    """Insert one encoded record into `table`; `sequence` None means "allocate one".

    `live_attempt`: refuse it (AttemptFinishedError) when its attempt or rollout is finished.
    """

    table: RecordTable
    rollout_key: str
    attempt_key: str
    sequence: int | None
    span_id: str | None
    rest: tuple[Any, ...]
    live_attempt: bool = False


@dataclass(slots=True)
class SequenceOp:
    """Allocate the next sequence number of (rollout_key, attempt_key)."""

    rollout_key: str
    attempt_key: str
    sequence: int | None = None


@dataclass(slots=True)
class FuncOp:
    """Run `fn(connection)` inside the batch transaction (used for the rollout state machine)."""

    fn: Callable[[sqlite3.Connection], Any]


WriteOp = RecordOp | SequenceOp | FuncOp


def _insert_sql(table: str, columns: tuple[str, ...]) -> str:
    placeholders = ", ".join("?" for _ in columns)
    # A re-delivered span (same span_id) is skipped, not duplicated and not an error.
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({placeholders}) "
        "ON CONFLICT (span_id) WHERE span_id IS NOT NULL DO NOTHING"
    )


_INSERTS: dict[str, str] = {
    "llm_calls": _insert_sql("llm_calls", LLM_CALL_COLUMNS),
    "rewards": _insert_sql("rewards", REWARD_COLUMNS),
    "spans": _insert_sql("spans", SPAN_COLUMNS),
}
_RECORD_NAMES = {"llm_calls": "LLM call", "rewards": "reward", "spans": "span"}
_WRITE_COUNTER = (
    "INSERT INTO sequences (rollout_key, attempt_key, next, touched_at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (rollout_key, attempt_key) DO UPDATE SET next = excluded.next, touched_at = excluded.touched_at"
)
_REFUSED_REWARD = "it takes no more rewards: report rewards before finishing the attempt"
_COUNTER_CHUNK = 256


def _read_counters(conn: sqlite3.Connection, keys: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """Current `next` of each (rollout_key, attempt_key) that has one, in one query per 256 keys."""
    found: dict[tuple[str, str], int] = {}
    for begin in range(0, len(keys), _COUNTER_CHUNK):
        chunk = keys[begin : begin + _COUNTER_CHUNK]
        # Pad to a power of two (repeating a key is harmless) so only a few statement shapes
        # exist and SQLite's prepared-statement cache keeps them.
        size = 1 << (len(chunk) - 1).bit_length()
        chunk = chunk + [chunk[-1]] * (size - len(chunk))
        values = ", ".join("(?, ?)" for _ in chunk)
        sql = (
            f"SELECT s.rollout_key, s.attempt_key, s.next FROM (VALUES {values}) AS wanted "
            "JOIN sequences AS s ON s.rollout_key = wanted.column1 AND s.attempt_key = wanted.column2"
        )
        params = [part for key in chunk for part in key]
        for rollout_key, attempt_key, next_value in conn.execute(sql, params):
            found[(rollout_key, attempt_key)] = next_value
    return found


class SQLiteWriter:
    """Owns the write connection; every method must run on the store's one writer thread."""

    def __init__(
        self,
        path: str,
        *,
        synchronous: str,
        busy_timeout_s: float,
        max_db_bytes: int | None,
        created_by: str,
    ) -> None:
        if synchronous not in SYNCHRONOUS_MODES:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS_MODES}, got {synchronous!r}")
        self.path = path
        self._synchronous = synchronous
        self._busy_timeout_s = busy_timeout_s
        self._max_db_bytes = max_db_bytes
        self._created_by = created_by
        self._conn: sqlite3.Connection | None = None

    def connect(self) -> None:
        """Create the file (mode 0600) if needed, open it, set the pragmas, create/check the schema."""
        if sqlite3.sqlite_version_info < MIN_SQLITE:
            raise StoreError(
                f"the store needs SQLite >= {'.'.join(map(str, MIN_SQLITE))} (UPSERT); this Python is linked "
                f"against SQLite {sqlite3.sqlite_version}; use a Python built with a newer SQLite"
            )
        _create_private_file(self.path)
        try:
            conn = sqlite3.connect(self.path, timeout=self._busy_timeout_s, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreWriteError(self.path, exc, what="open") from exc
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(
                    f"could not switch store {self.path} to WAL journal mode (SQLite kept {mode!r}); "
                    "the store needs a local file system with shared-memory support; move the file there"
                )
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")  # validated against a fixed list
            conn.execute("PRAGMA foreign_keys = ON")
            # Checkpoint every 4000 pages (16 MiB) rather than SQLite's 1000: each checkpoint costs
            # two fsyncs and rewrites hot index pages; measured ~10% more ingest. After a
            # checkpoint the WAL is truncated back to 32 MiB, so a burst leaves no huge file.
            conn.execute("PRAGMA wal_autocheckpoint = 4000")
            conn.execute("PRAGMA journal_size_limit = 33554432")
            if self._max_db_bytes is not None:
                page_size = conn.execute("PRAGMA page_size").fetchone()[0]
                conn.execute(f"PRAGMA max_page_count = {max(1, int(self._max_db_bytes) // int(page_size))}")
            ensure_schema(conn, self.path, self._created_by)
        except SchemaMismatch as exc:
            conn.close()
            raise StoreSchemaError(str(exc)) from None
        except sqlite3.DatabaseError as exc:
            conn.close()
            if "not a database" in str(exc):
                raise StoreSchemaError(
                    f"{self.path} is not a SQLite database ({exc}); point the store at a new file "
                    "or at a file agl_bridge created"
                ) from None
            raise StoreWriteError(self.path, exc, what="open") from exc
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def close(self) -> None:
        """Close the connection (a checkpoint folds the WAL back into the file)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def apply_batch(self, ops: list[WriteOp]) -> list[Any]:
        """Apply `ops` in one transaction; return one outcome (value or Failure) per op."""
        conn = self._conn
        if conn is None:
            raise StoreError(f"store {self.path} writer is not connected")
        outcomes: list[Any] = [None] * len(ops)
        try:
            conn.execute("BEGIN IMMEDIATE")
            records: list[int] = []
            sequenced: list[int] = []
            changed = False
            for index, op in enumerate(ops):
                if type(op) is RecordOp:
                    if op.live_attempt and (refused := _refusal(conn, op)) is not None:
                        outcomes[index] = refused
                        continue
                    records.append(index)
                    sequenced.append(index)
                elif type(op) is SequenceOp:
                    sequenced.append(index)
                else:
                    changed = True
                    outcomes[index] = self._apply_func(conn, op)  # type: ignore[arg-type]
            if sequenced:
                self._assign_sequences(conn, ops, sequenced)
                for index in sequenced:
                    outcomes[index] = ops[index].sequence  # type: ignore[union-attr]
            if records:
                self._insert_records(conn, ops, records, outcomes)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._rollback(conn)
            return [Failure(StoreWriteError(self.path, exc)) for _ in ops]
        except BaseException:
            self._rollback(conn)
            raise
        if changed:
            notify_change(self.path)
        return outcomes

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        # Some errors (SQLITE_FULL, SQLITE_IOERR) already rolled the transaction back.
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    @staticmethod
    def _apply_func(conn: sqlite3.Connection, op: FuncOp) -> Any:
        conn.execute("SAVEPOINT agl_op")
        try:
            result = op.fn(conn)
        except sqlite3.IntegrityError as exc:
            conn.execute("ROLLBACK TO agl_op")
            conn.execute("RELEASE agl_op")
            return Failure(DuplicateRecordError(str(exc)))
        except sqlite3.Error:
            raise  # the database itself failed: the whole batch fails
        except Exception as exc:  # the op's own error (illegal transition, unknown id): only its caller
            conn.execute("ROLLBACK TO agl_op")
            conn.execute("RELEASE agl_op")
            return Failure(exc)
        conn.execute("RELEASE agl_op")
        return result

    @staticmethod
    def _assign_sequences(conn: sqlite3.Connection, ops: list[WriteOp], sequenced: list[int]) -> None:
        # Per key: the floor (one past the largest explicit sequence in this batch) and how many
        # numbers to allocate. Allocating above the floor keeps `next` above every stored sequence.
        # Read-then-write is atomic here: the batch transaction holds SQLite's write lock.
        needs: dict[tuple[str, str], list[int]] = {}
        for index in sequenced:
            op = ops[index]
            need = needs.setdefault((op.rollout_key, op.attempt_key), [0, 0])  # type: ignore[union-attr]
            if op.sequence is None:  # type: ignore[union-attr]
                need[1] += 1
            elif op.sequence >= need[0]:  # type: ignore[union-attr]
                need[0] = op.sequence + 1  # type: ignore[union-attr]
        current = _read_counters(conn, list(needs))
        starts: dict[tuple[str, str], int] = {}
        updates = []
        now = time.time()
        # The first records under these (rollout, attempt) keys: make their rollouts visible, all at once.
        new_keys = [key for key in needs if key not in current and key[0]]
        if new_keys:
            register_keys(conn, new_keys, now)
        for key, (floor, count) in needs.items():
            start = max(current.get(key, 0), floor)
            starts[key] = start
            updates.append((key[0], key[1], start + count, now))
        conn.executemany(_WRITE_COUNTER, updates)
        for index in sequenced:
            op = ops[index]
            if op.sequence is None:  # type: ignore[union-attr]
                key = (op.rollout_key, op.attempt_key)  # type: ignore[union-attr]
                op.sequence = starts[key]  # type: ignore[union-attr]
                starts[key] += 1

    def _insert_records(
        self, conn: sqlite3.Connection, ops: list[WriteOp], records: list[int], outcomes: list[Any]
    ) -> None:
        rows_by_table: dict[str, list[tuple[Any, ...]]] = {}
        for index in records:
            op: RecordOp = ops[index]  # type: ignore[assignment]
            row = (op.rollout_key, op.attempt_key, op.sequence, *op.rest)
            rows_by_table.setdefault(op.table, []).append(row)
        # Fast path: one executemany per table. If any row is a duplicate (same span re-delivered,
        # or a sequence slot already taken) undo it and go row by row to tell each caller.
        conn.execute("SAVEPOINT agl_records")
        try:
            inserted = 0
            for table, rows in rows_by_table.items():
                inserted += conn.executemany(_INSERTS[table], rows).rowcount
            clean = inserted == len(records)
        except sqlite3.IntegrityError:
            clean = False
        if clean:
            conn.execute("RELEASE agl_records")
            return
        conn.execute("ROLLBACK TO agl_records")
        conn.execute("RELEASE agl_records")
        for index in records:
            outcomes[index] = self._insert_one(conn, ops[index])  # type: ignore[arg-type]

    @staticmethod
    def _insert_one(conn: sqlite3.Connection, op: RecordOp) -> Any:
        table = op.table
        row = (op.rollout_key, op.attempt_key, op.sequence, *op.rest)
        try:
            inserted = conn.execute(_INSERTS[table], row).rowcount
        except sqlite3.IntegrityError:
            return Failure(slot_taken(op))
        if inserted:
            return op.sequence
        # The same span was stored before: report the sequence it was stored under.
        (sequence,) = conn.execute(f"SELECT sequence FROM {table} WHERE span_id = ?", (op.span_id,)).fetchone()
        return sequence


def slot_taken(op: RecordOp) -> DuplicateRecordError:
    """The error of a record whose (rollout, attempt, sequence[, choice]) slot another record holds."""
    choice = f", choice {op.rest[0]}" if op.table == "llm_calls" else ""
    return DuplicateRecordError(
        f"a {_RECORD_NAMES[op.table]} already holds rollout {op.rollout_key or None!r}, attempt "
        f"{op.attempt_key or None!r}, sequence {op.sequence}{choice}; sequences come from "
        "next_sequence() and each may be used once (leave sequence=None to have one allocated)"
    )


def _refusal(conn: sqlite3.Connection, op: RecordOp) -> Failure | None:
    """A live-attempt record's refusal when its attempt or rollout is finished, else None."""
    try:
        check_open(conn, op.rollout_key, op.attempt_key, _REFUSED_REWARD)
    except AttemptFinishedError as error:
        return Failure(error)
    return None


_waiters_lock = threading.Lock()
_waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}


def change_key(path: str) -> str:
    """The key under which the writers of one store file (in this process) announce state changes."""
    return os.path.realpath(path)


@contextlib.contextmanager
def change_waiter(path: str) -> Iterator[asyncio.Event]:
    """An event set (on the caller's loop) whenever a writer of `path` in this process commits a state change."""
    entry = (asyncio.get_running_loop(), asyncio.Event())
    key = change_key(path)
    with _waiters_lock:
        _waiters.setdefault(key, set()).add(entry)
    try:
        yield entry[1]
    finally:
        with _waiters_lock:
            _waiters[key].discard(entry)


def notify_change(path: str) -> None:
    """Wake every `change_waiter` of `path` (called on the writer thread after a commit)."""
    with _waiters_lock:
        waiting = list(_waiters.get(change_key(path), ()))
    for loop, event in waiting:
        with contextlib.suppress(RuntimeError):  # that loop closed meanwhile
            loop.call_soon_threadsafe(event.set)


def _create_private_file(path: str) -> None:
    # Create the file ourselves so it is 0600 from the first byte (SQLite would use 0644 minus
    # umask); the -wal and -shm files SQLite creates copy the main file's permissions.
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    except OSError as exc:
        raise StoreWriteError(path, exc, what="create") from exc
    os.close(fd)
