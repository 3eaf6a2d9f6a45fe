"""The write side of the PostgreSQL store: one connection on the group-commit thread, one transaction per batch.

`PostgresWriter` is SQLiteWriter's counterpart (`sqlite_writer.py`, same operations, same
outcomes), run by the same `GroupCommitter`. A batch is applied as: BEGIN → the state lock, when
the batch may change rollout or attempt state → state-machine operations (`rollout_rules.py`, each
in a SAVEPOINT) → sequence allocation → one INSERT per record table → COMMIT (`synchronous_commit`
on: the WAL is flushed before COMMIT returns, so a caller's await returns only once its record is
durable).

Several processes (proxies on several machines) write one database at once, so what SQLite gets
from its single write lock is made explicit here:
  - Sequence numbers: the batch locks the counter rows of its (rollout, attempt) keys with
    `SELECT … ORDER BY key FOR UPDATE` (sorted, so two batches never wait on each other in a
    cycle), computes the numbers, and writes the counters back in the transaction that inserts the
    records. A second process's batch on the same key waits for the first to commit, then reads
    the new counter: no duplicates; and a rolled-back batch rolls its counters back: no gaps.
  - The rollout state machine: a batch with state-machine operations or live-reward checks takes
    one advisory transaction lock (`STATE_LOCK`) before any row lock, so check-then-update runs as
    it does under SQLite's write lock. A batch whose only state change is registering keys this
    process has not seen stored yet (a rollout's first records) takes that lock shared — beside
    other such batches, never beside a state change — and then an advisory lock per rollout it
    registers, in one order (`ROLLOUT_LOCKS`), so two registrations of one rollout take turns
    while registrations of different rollouts commit side by side (with a new rollout per request,
    the exclusive lock held through each COMMIT's WAL flush made two proxies write one at a time).
    Keys known to exist (counters are never deleted) skip both: the hot path of a running rollout
    takes no global lock.
  - A deadlock or serialization failure (the server's detector breaking a cycle the ordering above
    should prevent) retries the batch.
A batch with state-machine operations sends `NOTIFY agl_store_change` (delivered at commit) for
`wait_for_change`, as SQLite's writer wakes its waiters; registrations do not (PostgreSQL holds
one lock per database from a NOTIFY until its transaction committed, which would serialize them).
A lost connection fails the batch with StoreUnavailableError (the transaction never committed, so
nothing was acknowledged that is not durable; a COMMIT cut off mid-flight may have landed, and its
callers retry) and the next batch reconnects.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from typing import Any

from agl_bridge.store.errors import (
    AttemptFinishedError,
    DuplicateRecordError,
    StoreSchemaError,
    StoreUnavailableError,
    StoreWriteError,
)
from agl_bridge.store.group_commit import Failure
from agl_bridge.store.postgres_schema import ensure_schema
from agl_bridge.store.rollout_rules import check_open, register_keys
from agl_bridge.store.schema import SchemaMismatch
from agl_bridge.store.sqlite_rows import LLM_CALL_COLUMNS, REWARD_COLUMNS, SPAN_COLUMNS
from agl_bridge.store.sqlite_writer import FuncOp, RecordOp, SequenceOp, WriteOp, slot_taken

STATE_LOCK = 0x61676C5F73746100
"""Advisory lock key of the rollout state machine ("agl_sta")."""

ROLLOUT_LOCKS = 0x61676C5F
"""Class of the per-rollout advisory locks of registrations ("agl_"; two-int4 keys: apart from STATE_LOCK's)."""

CHANGE_CHANNEL = "agl_store_change"
"""The LISTEN/NOTIFY channel a state change is announced on."""

_KNOWN_KEYS_MAX = 100_000
_RETRIES = 5

# PostgreSQL types of the record columns that are not text, for the array parameters of `unnest`.
_COLUMN_TYPES = {
    "sequence": "int8",
    "choice_index": "int4",
    "prompt_token_ids": "bytea",
    "response_token_ids": "bytea",
    "response_logprobs": "bytea",
    "token_policy_versions": "bytea",
    "policy_version": "int4",
    "response_text": "bytea",
    "started_at": "float8",
    "ended_at": "float8",
    "input_tokens": "int4",
    "output_tokens": "int4",
    "value": "float8",
    "timestamp": "float8",
    "start_time_ns": "int8",
    "end_time_ns": "int8",
}
_REFUSED_REWARD = "it takes no more rewards: report rewards before finishing the attempt"


def _bulk_insert_sql(table: str, columns: tuple[str, ...]) -> str:
    # One statement per table and batch: each column as one array parameter, zipped by unnest. Sent
    # in binary (%b): psycopg's text array format escapes every element with a regex, twice the CPU.
    arrays = ", ".join(f"%b::{_COLUMN_TYPES.get(column, 'text')}[]" for column in columns)
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) SELECT * FROM unnest({arrays}) "
        "ON CONFLICT (span_id) WHERE span_id IS NOT NULL DO NOTHING"
    )


def _one_insert_sql(table: str, columns: tuple[str, ...]) -> str:
    placeholders = ", ".join("%s" for _ in columns)
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({placeholders}) "
        "ON CONFLICT (span_id) WHERE span_id IS NOT NULL DO NOTHING"
    )


_TABLE_COLUMNS = {"llm_calls": LLM_CALL_COLUMNS, "rewards": REWARD_COLUMNS, "spans": SPAN_COLUMNS}
_BULK_INSERTS = {table: _bulk_insert_sql(table, columns) for table, columns in _TABLE_COLUMNS.items()}
_ONE_INSERTS = {table: _one_insert_sql(table, columns) for table, columns in _TABLE_COLUMNS.items()}
_LOCK_COUNTERS = (
    "SELECT s.rollout_key, s.attempt_key, s.next FROM sequences AS s "
    "JOIN unnest(%b::text[], %b::text[]) AS wanted(r, a) ON s.rollout_key = wanted.r AND s.attempt_key = wanted.a "
    "ORDER BY s.rollout_key, s.attempt_key FOR UPDATE OF s"
)
_LOCK_ROLLOUTS = f"SELECT count(pg_advisory_xact_lock({ROLLOUT_LOCKS}, k)) FROM unnest(%b::int4[]) AS k"
"""Takes the given rollouts' locks in the array's order (sorted by the caller: no two batches wait in a cycle)."""
_WRITE_COUNTERS = (
    "INSERT INTO sequences (rollout_key, attempt_key, next, touched_at) "
    "SELECT r, a, n, %s FROM unnest(%b::text[], %b::text[], %b::int8[]) AS w(r, a, n) ORDER BY r, a "
    "ON CONFLICT (rollout_key, attempt_key) DO UPDATE SET next = excluded.next, touched_at = excluded.touched_at"
)


RESPONSE_TEXT_INDEX = LLM_CALL_COLUMNS.index("response_text")


def rollout_lock(rollout_id: str) -> int:
    """The per-rollout advisory lock key (int4) of `rollout_id` (two rollouts may share one: they take turns)."""
    return int.from_bytes(hashlib.blake2b(rollout_id.encode(), digest_size=4).digest(), "big", signed=True)


def pg_text(value: Any) -> Any:
    """A parameter as PostgreSQL text can hold it: NUL (which text cannot store) becomes U+FFFD."""
    if isinstance(value, str) and "\x00" in value:
        return value.replace("\x00", "\ufffd")
    return value


def pg_record_row(table: str, row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A record row for PostgreSQL: a call's response text as UTF-8 bytes (exact), NUL-free other text."""
    values = [pg_text(value) for value in row]
    if table == "llm_calls" and row[RESPONSE_TEXT_INDEX] is not None:
        values[RESPONSE_TEXT_INDEX] = row[RESPONSE_TEXT_INDEX].encode("utf-8", "surrogatepass")
    return tuple(values)


def from_pg_call_row(row: Any) -> Any:
    """A selected llm_calls row with its response text decoded back to str (for the shared decoders)."""
    text = row[RESPONSE_TEXT_INDEX]
    if text is None:
        return row
    values = list(row)
    values[RESPONSE_TEXT_INDEX] = bytes(text).decode("utf-8", "surrogatepass")
    return values


class QmarkConnection:
    """A psycopg connection that takes the `?` placeholders of the shared rules (`rollout_rules.SqlConnection`)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._translated: dict[str, str] = {}

    def execute(self, sql: str, parameters: Any = (), /) -> Any:
        """Run one statement written with `?` placeholders (the rules' SQL holds no `?` or `%` otherwise)."""
        translated = self._translated.get(sql)
        if translated is None:
            translated = self._translated[sql] = sql.replace("?", "%s")
        return self._conn.execute(translated, [pg_text(value) for value in parameters])


def describe_dsn(dsn: str) -> str:
    """ "host:port/database as user" of a libpq DSN or URL: what error messages name (never the password)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(dsn)
    except Exception:  # an unparsable DSN: name nothing of it (it may hold a password)
        return "(an unparsable PostgreSQL DSN)"
    host = parts.get("host") or parts.get("hostaddr") or "localhost"
    port = parts.get("port") or "5432"
    database = parts.get("dbname") or parts.get("user") or "(the user's database)"
    user = f" as {parts['user']}" if parts.get("user") else ""
    return f"postgresql://{host}:{port}/{database}{user}"


def connect(dsn: str, where: str, *, connect_timeout_s: float, autocommit: bool = True) -> Any:
    """A psycopg connection, or StoreUnavailableError naming `where` (host/port/database, no password)."""
    import psycopg

    try:
        return psycopg.connect(dsn, autocommit=autocommit, connect_timeout=max(1, round(connect_timeout_s)))
    except psycopg.Error as exc:
        raise StoreUnavailableError(where, without_secrets(exc, dsn)) from None


def without_secrets(exc: BaseException, dsn: str) -> str:
    """The first line of a connection error, with the DSN's password (if any) blanked out."""
    from psycopg.conninfo import conninfo_to_dict

    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    try:
        password = conninfo_to_dict(dsn).get("password")
    except Exception:
        password = None
    if password:
        text = text.replace(str(password), "***")
    return text.removeprefix("connection failed: ")


class PostgresWriter:
    """Owns the write connection; every method must run on the store's one writer thread."""

    def __init__(self, dsn: str, *, where: str, created_by: str, connect_timeout_s: float) -> None:
        self._dsn = dsn
        self.where = where
        self._created_by = created_by
        self._connect_timeout_s = connect_timeout_s
        self._conn: Any = None
        self._qmark: QmarkConnection | None = None
        self._commit_sent = False
        self._known: OrderedDict[tuple[str, str], None] = OrderedDict()  # keys whose counter is stored

    def connect(self) -> None:
        """Connect and create or check the schema (StoreSchemaError on a mismatch)."""
        import psycopg

        conn = connect(self._dsn, self.where, connect_timeout_s=self._connect_timeout_s)
        try:
            ensure_schema(conn, self.where, self._created_by)
        except SchemaMismatch as exc:
            conn.close()
            raise StoreSchemaError(str(exc)) from None
        except psycopg.OperationalError as exc:
            conn.close()
            raise StoreUnavailableError(self.where, exc) from None
        except psycopg.Error as exc:
            conn.close()
            raise StoreWriteError(self.where, exc, what="open") from exc
        self._conn = conn
        self._qmark = QmarkConnection(conn)

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def apply_batch(self, ops: list[WriteOp]) -> list[Any]:
        """Apply `ops` in one transaction; return one outcome (value or Failure) per op."""
        import psycopg
        from psycopg import errors as pg_errors

        given = [op.sequence if not isinstance(op, FuncOp) else None for op in ops]
        reconnected = False
        for attempt in range(_RETRIES):
            try:
                if self._conn is None or self._conn.closed or self._conn.broken:
                    self.close()
                    self.connect()
                    reconnected = True
                return self._apply(ops)
            except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure):
                if attempt == _RETRIES - 1:
                    raise
            except StoreUnavailableError as exc:
                return [Failure(exc) for _ in ops]
            except psycopg.OperationalError as exc:
                self.close()
                # A connection found dead before COMMIT was sent (the server restarted while it sat
                # idle) committed nothing: reconnect and apply the batch once more. After COMMIT was
                # sent the outcome is unknown: fail the callers, who retry.
                if self._commit_sent or reconnected:
                    return [Failure(StoreUnavailableError(self.where, exc)) for _ in ops]
            except psycopg.Error as exc:
                return [Failure(StoreWriteError(self.where, exc)) for _ in ops]
            for op, sequence in zip(ops, given, strict=True):  # allocate afresh on the retry
                if not isinstance(op, FuncOp):
                    op.sequence = sequence
        raise AssertionError("unreachable")

    def _apply(self, ops: list[WriteOp]) -> list[Any]:
        conn, qmark = self._conn, self._qmark
        assert conn is not None and qmark is not None
        outcomes: list[Any] = [None] * len(ops)
        records: list[int] = []
        sequenced: list[int] = []
        funcs: list[int] = []
        live = False
        for index, op in enumerate(ops):
            if type(op) is RecordOp:
                live = live or op.live_attempt
                records.append(index)
                sequenced.append(index)
            elif type(op) is SequenceOp:
                sequenced.append(index)
            else:
                funcs.append(index)
        self._commit_sent = False
        keys = sorted({(ops[i].rollout_key, ops[i].attempt_key) for i in sequenced})  # type: ignore[union-attr]
        unseen = {key[0] for key in keys if key[0] and key not in self._known}
        with conn.transaction():
            if funcs or live:
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (STATE_LOCK,))
            elif unseen:
                conn.execute("SELECT pg_advisory_xact_lock_shared(%s)", (STATE_LOCK,))
                conn.execute(_LOCK_ROLLOUTS, (sorted({rollout_lock(rollout_id) for rollout_id in unseen}),))
            for index in funcs:
                outcomes[index] = self._apply_func(ops[index])  # type: ignore[arg-type]
            kept: list[int] = []
            for index in records:
                record: RecordOp = ops[index]  # type: ignore[assignment]
                if record.live_attempt:
                    try:
                        check_open(qmark, record.rollout_key, record.attempt_key, _REFUSED_REWARD)
                    except AttemptFinishedError as error:
                        outcomes[index] = Failure(error)
                        sequenced.remove(index)
                        continue
                kept.append(index)
            if sequenced:
                self._assign_sequences(ops, sequenced)
            for index in sequenced:
                outcomes[index] = ops[index].sequence  # type: ignore[union-attr]
            if kept:
                self._insert_records(ops, kept, outcomes)
            if funcs:
                conn.execute(f"NOTIFY {CHANGE_CHANNEL}")
            self._commit_sent = True  # leaving the block sends COMMIT
        for key in keys:  # committed: these counters exist from now on
            self._known[key] = None
            self._known.move_to_end(key)
        while len(self._known) > _KNOWN_KEYS_MAX:
            self._known.popitem(last=False)
        return outcomes

    def _apply_func(self, op: FuncOp) -> Any:
        import psycopg

        conn = self._conn
        try:
            with conn.transaction():  # a savepoint: one illegal transition fails only its caller
                return op.fn(self._qmark)  # type: ignore[arg-type]
        except psycopg.IntegrityError as exc:
            return Failure(DuplicateRecordError(str(exc)))
        except psycopg.Error:
            raise  # the database itself failed: the whole batch fails
        except Exception as exc:  # the op's own error (illegal transition, unknown id): only its caller
            return Failure(exc)

    def _assign_sequences(self, ops: list[WriteOp], sequenced: list[int]) -> None:
        """Give every op of `sequenced` its number, registering the rollouts of keys new to the store."""
        needs: dict[tuple[str, str], list[int]] = {}
        for index in sequenced:
            op = ops[index]
            need = needs.setdefault((op.rollout_key, op.attempt_key), [0, 0])  # type: ignore[union-attr]
            if op.sequence is None:  # type: ignore[union-attr]
                need[1] += 1
            elif op.sequence >= need[0]:  # type: ignore[union-attr]
                need[0] = op.sequence + 1  # type: ignore[union-attr]
        keys = sorted(needs)
        conn = self._conn
        current = {
            (r, a): n
            for r, a, n in conn.execute(_LOCK_COUNTERS, ([k[0] for k in keys], [k[1] for k in keys])).fetchall()
        }
        now = time.time()
        # The first records under these (rollout, attempt) keys: make their rollouts visible, all at once.
        new_keys = [key for key in keys if key not in current and key[0]]
        if new_keys:
            register_keys(self._qmark, new_keys, now)  # type: ignore[arg-type]
        starts: dict[tuple[str, str], int] = {}
        nexts: list[int] = []
        for key in keys:
            floor, count = needs[key]
            start = max(current.get(key, 0), floor)
            starts[key] = start
            nexts.append(start + count)
        conn.execute(_WRITE_COUNTERS, (now, [k[0] for k in keys], [k[1] for k in keys], nexts))
        for index in sequenced:
            op = ops[index]
            if op.sequence is None:  # type: ignore[union-attr]
                key = (op.rollout_key, op.attempt_key)  # type: ignore[union-attr]
                op.sequence = starts[key]  # type: ignore[union-attr]
                starts[key] += 1

    def _insert_records(self, ops: list[WriteOp], records: list[int], outcomes: list[Any]) -> None:
        import psycopg

        conn = self._conn
        rows_by_table: dict[str, list[tuple[Any, ...]]] = {}
        for index in records:
            op: RecordOp = ops[index]  # type: ignore[assignment]
            row = (op.rollout_key, op.attempt_key, op.sequence, *op.rest)
            rows_by_table.setdefault(op.table, []).append(pg_record_row(op.table, row))
        # Fast path: one statement per table. If any row is a duplicate (a span re-delivered, or a
        # sequence slot already taken) undo them and go row by row to tell each caller.
        try:
            with conn.transaction():
                inserted = 0
                for table, rows in rows_by_table.items():
                    columns = [list(column) for column in zip(*rows, strict=True)]
                    inserted += conn.execute(_BULK_INSERTS[table], columns).rowcount
                if inserted != len(records):
                    raise _Redo
            return
        except (_Redo, psycopg.IntegrityError):
            pass
        for index in records:
            outcomes[index] = self._insert_one(ops[index])  # type: ignore[arg-type]

    def _insert_one(self, op: RecordOp) -> Any:
        import psycopg

        conn = self._conn
        row = pg_record_row(op.table, (op.rollout_key, op.attempt_key, op.sequence, *op.rest))
        try:
            with conn.transaction():
                inserted = conn.execute(_ONE_INSERTS[op.table], row).rowcount
        except psycopg.IntegrityError:
            return Failure(slot_taken(op))
        if inserted:
            return op.sequence
        # The same span was stored before: report the sequence it was stored under.
        (sequence,) = conn.execute(f"SELECT sequence FROM {op.table} WHERE span_id = %s", (op.span_id,)).fetchone()
        return sequence


class _Redo(Exception):
    """Internal: the bulk insert skipped a row; roll it back and insert row by row."""
