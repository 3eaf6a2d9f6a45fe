"""`PostgresStore`: the `Store` API on a PostgreSQL database, for several proxies (and machines) on one run.

Selected by a `postgresql://…` (or `postgres://…`) store location (`open_store`). The promises are
SQLite's: a write returns only once its transaction committed (`synchronous_commit` on: flushed to
the server's WAL), writes from concurrent callers share one transaction per batch (the same
`GroupCommitter`, its thread holding one psycopg connection: `postgres_writer.py`), pending writes
are bounded (`max_pending`), sequence numbers are allocated in the database without gaps or
duplicates per (rollout, attempt) across processes, the rollout state machine is the shared
`rollout_rules.py`, and the schema is versioned (`postgres_schema.py`).

Reads: point reads on one shared async connection (per event loop); streams (an attempt's calls, a whole export,
the converter's walk) each on a connection of their own through server-side cursors (`DECLARE …
CURSOR`, fetched `read_page_size` rows at a time), so memory holds a page whatever the table
holds. An asyncio connection belongs to the event loop it was opened on, so each loop that reads
gets its own (the store object serves every loop of the process, as the writer does). The
converter's whole-store walk reads rollouts, attempts, calls and rewards in one REPEATABLE READ
transaction: one consistent snapshot, never blocking writers.

Faults: an unreachable or restarting server fails writes and reads with StoreUnavailableError
(the proxy answers 503 `store_unavailable`; nothing unacknowledged is lost, nothing acknowledged
was not committed) and the next use reconnects. Messages name the database as
`postgresql://host:port/database as user`, never the password.

Why psycopg 3 (not asyncpg): the writer runs on the group-commit thread, where psycopg's
synchronous connection runs a whole batch without an event loop hop per statement (the design
the SQLite writer has), while reads use its asyncio connection; one library gives both, plus
server-side cursors and LISTEN/NOTIFY (`wait_for_change`). asyncpg is asyncio-only.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, TypeGuard

from agl_bridge._version import __version__
from agl_bridge.store.base import group_rollout_records
from agl_bridge.store.batched import CALL_KEY, RECORD_KEY, BatchedStore, RolloutCursor
from agl_bridge.store.errors import RolloutNotFoundError, StoreClosedError, StoreError, StoreUnavailableError
from agl_bridge.store.group_commit import GroupCommitter
from agl_bridge.store.postgres_writer import (
    CHANGE_CHANNEL,
    PostgresWriter,
    describe_dsn,
    from_pg_call_row,
    without_secrets,
)
from agl_bridge.store.sqlite_rows import (
    ATTEMPT_SELECT,
    LLM_CALL_SELECT,
    NO_ID,
    REWARD_SELECT,
    ROLLOUT_SELECT,
    TOKEN_CALL_SELECT,
    decode_attempt,
    decode_llm_call,
    decode_reward,
    decode_rollout,
    decode_token_call,
)
from agl_bridge.store.sqlite_writer import WriteOp
from agl_bridge.types import LLMCall, RolloutRecords

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
"""Store locations with these prefixes name a PostgreSQL database."""

_CALL_ORDER = ", ".join(CALL_KEY)
_RECORD_ORDER = ", ".join(RECORD_KEY)
_IDLE_READERS = 4
_cursor_names = itertools.count()


def is_postgres_location(location: object) -> TypeGuard[str]:
    """Whether a store location (CLI `--store`, config `store`) names a PostgreSQL database."""
    return isinstance(location, str) and location.startswith(POSTGRES_SCHEMES)


def _decode_pg_call(row: Sequence[Any]) -> LLMCall:
    """`decode_llm_call` of a PostgreSQL row (its response text stored as bytes)."""
    return decode_llm_call(from_pg_call_row(row))


class PostgresStore(BatchedStore):
    """A `Store` in a PostgreSQL database; use as `async with PostgresStore(dsn) as store:`.

    dsn: a libpq URL (`postgresql://user:password@host:port/database`) or key=value string; the
      database must exist (the store creates its tables in it, or checks their version).
    max_pending: most writes held in memory (queued or being committed); further writers wait.
    max_batch: most writes committed in one transaction.
    read_page_size: rows fetched per round trip while streaming.
    connect_timeout_s: how long a (re)connection may take before the store is called unreachable.
    """

    _creation_order = "created_order"
    _decode_call = staticmethod(_decode_pg_call)

    def __init__(
        self,
        dsn: str,
        *,
        max_pending: int = 4096,
        max_batch: int = 512,
        read_page_size: int = 256,
        connect_timeout_s: float = 5.0,
    ) -> None:
        if read_page_size < 1:
            raise ValueError(f"read_page_size must be >= 1, got {read_page_size}")
        self.dsn = dsn
        self.where = describe_dsn(dsn)
        self._max_pending = max_pending
        self._max_batch = max_batch
        self._page = read_page_size
        self._connect_timeout_s = connect_timeout_s
        self._writer = PostgresWriter(
            dsn, where=self.where, created_by=f"agl_bridge {__version__}", connect_timeout_s=connect_timeout_s
        )
        self._committer: GroupCommitter[WriteOp] | None = None
        # Per event loop (a psycopg async connection is used from the loop it was opened on): the
        # point-read connection, and stream connections kept for the next stream.
        self._readers: dict[asyncio.AbstractEventLoop, Any] = {}
        self._idle: dict[asyncio.AbstractEventLoop, list[Any]] = {}
        self._translated: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"PostgresStore({self.where!r})"

    # --- lifecycle --------------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect, create or check the schema, start the writer; StoreUnavailableError if unreachable."""
        if self._committer is not None:
            return
        committer: GroupCommitter[WriteOp] = GroupCommitter(
            self._writer.apply_batch,
            max_pending=self._max_pending,
            max_batch=self._max_batch,
            setup=self._writer.connect,
            teardown=self._writer.close,
            name=f"store {self.where}",
        )
        await committer.start()
        try:
            self._readers[asyncio.get_running_loop()] = await self._connect()
        except BaseException:
            await committer.close()
            raise
        self._committer = committer

    async def close(self) -> None:
        """Commit every submitted write, then close the connections and the writer thread."""
        committer, self._committer = self._committer, None
        if committer is None:
            return
        await committer.close()
        # Closing a connection only ends its libpq session (no await on its loop): any loop's can be closed here.
        for conn in [*self._readers.values(), *(c for idle in self._idle.values() for c in idle)]:
            await conn.close()
        self._readers, self._idle = {}, {}

    async def __aenter__(self) -> PostgresStore:
        """Open the store and return it."""
        await self.open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Close the store."""
        await self.close()

    async def _connect(self) -> Any:
        import psycopg

        try:
            return await psycopg.AsyncConnection.connect(
                self.dsn, autocommit=True, connect_timeout=max(1, round(self._connect_timeout_s))
            )
        except psycopg.Error as exc:
            raise StoreUnavailableError(self.where, without_secrets(exc, self.dsn)) from None

    # --- reads ------------------------------------------------------------------------------------

    async def _fetch(self, sql: str, params: Sequence[Any]) -> list[Any]:
        import psycopg

        if self._committer is None:
            raise StoreClosedError(
                f"store {self.where} is not open; use `async with store:` or `await store.open()` first"
            )
        loop = asyncio.get_running_loop()
        for retry in (False, True):
            reader: Any = self._readers.get(loop)
            fresh = reader is None or reader.closed or reader.broken
            if fresh:
                reader = self._readers[loop] = await self._connect()
            try:
                cursor = await reader.execute(self._pg(sql), params)
                return list(await cursor.fetchall())
            except psycopg.OperationalError as exc:
                await reader.close()
                if fresh or retry:  # a read is safe to repeat once on a new connection
                    raise StoreUnavailableError(self.where, exc) from None
            except psycopg.Error as exc:
                raise StoreError(f"could not read store {self.where}: {exc}") from exc
        raise AssertionError("unreachable")

    def _pg(self, sql: str) -> str:
        """`?` placeholders (the shared reads) as psycopg's `%s`."""
        translated = self._translated.get(sql)
        if translated is None:
            translated = self._translated[sql] = sql.replace("?", "%s")
        return translated

    async def change_token(self) -> int:
        """A mark of the store's state now, for `wait_for_change(since=...)`: take it before reading.

        The latest rollout update time (µs) with the number of rollouts and of finished attempts:
        every state change (a new rollout or attempt, a status, a mark) moves one of them.
        """
        rows = await self._fetch(
            "SELECT (SELECT coalesce(max(updated_at), 0) FROM rollouts), (SELECT count(*) FROM rollouts), "
            "(SELECT count(*) FROM attempts WHERE status <> 'running')",
            (),
        )
        updated, rollouts, finished = rows[0]
        return hash((int(float(updated) * 1e6), int(rollouts), int(finished)))

    async def wait_for_change(self, timeout_s: float, *, since: int | None = None, poll_s: float = 0.25) -> bool:
        """Wait until a rollout or attempt may have changed; False once `timeout_s` passed without one.

        since: a `change_token()` taken before the caller read what it waits to see change; a change
        committed after it returns at once. Listens on the store's NOTIFY channel, which every
        commit of a state-machine operation (start, finish, status, marks) of any process signals —
        a rollout first seen through a record does not (poll_s is not needed: the server pushes),
        subscribed before the token is compared, so no change falls in between. Never spins.
        """
        import psycopg

        conn = await self._connect()
        try:
            await conn.execute(f"LISTEN {CHANGE_CHANNEL}")
            if since is not None and await self.change_token() != since:
                return True
            async for _ in conn.notifies(timeout=max(0.0, timeout_s), stop_after=1):
                return True
            return False
        except psycopg.OperationalError as exc:
            raise StoreUnavailableError(self.where, exc) from None
        finally:
            await conn.close()

    @contextlib.asynccontextmanager
    async def _snapshot(self) -> AsyncIterator[Any]:
        """A connection of its own in a REPEATABLE READ read-only transaction (for server-side cursors)."""
        import psycopg

        if self._committer is None:
            raise StoreClosedError(
                f"store {self.where} is not open; use `async with store:` or `await store.open()` first"
            )
        idle = self._idle.setdefault(asyncio.get_running_loop(), [])
        conn = idle.pop() if idle else await self._connect()
        try:
            await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
            await conn.set_read_only(True)
            async with conn.transaction():
                yield conn
        except psycopg.OperationalError as exc:
            await conn.close()
            raise StoreUnavailableError(self.where, exc) from None
        except BaseException:
            await conn.close()
            raise
        if len(idle) < _IDLE_READERS and not conn.closed:
            idle.append(conn)
        else:
            await conn.close()

    async def _cursor_pages(self, conn: Any, sql: str, params: Sequence[Any]) -> AsyncGenerator[list[Any], None]:
        """The rows of `sql` a page at a time from a server-side cursor on `conn` (in its transaction)."""
        async with conn.cursor(name=f"agl_read_{next(_cursor_names)}") as cursor:
            await cursor.execute(sql, params)
            while rows := await cursor.fetchmany(self._page):
                yield rows

    async def _stream(
        self, table: str, select: str, key: tuple[str, ...], fixed: Sequence[str], *, attributed_only: bool
    ) -> AsyncIterator[Sequence[Any]]:
        where: list[str] = [f"{column} = %s" for column in ("rollout_key", "attempt_key")[: len(fixed)]]
        params: list[Any] = list(fixed)
        if attributed_only and not fixed:
            where.append("rollout_key > %s")
            params.append(NO_ID)
        sql = f"SELECT {select} FROM {table}" + (" WHERE " + " AND ".join(where) if where else "")
        async with self._snapshot() as conn:
            async for rows in self._cursor_pages(conn, f"{sql} ORDER BY {', '.join(key)}", params):
                for row in rows:
                    yield row

    async def iter_rollout_records(
        self, rollout_ids: Iterable[str] | None = None, *, tokens_only: bool = False
    ) -> AsyncIterator[RolloutRecords]:
        """Stream rollouts one at a time with their attempts, calls and rewards (see `Store`).

        The whole-store walk (rollout_ids None) opens four server-side cursors in one snapshot —
        rollouts, attempts, calls, rewards, each ordered by rollout id — and merges them rollout by
        rollout; memory holds a page of each plus the current rollout.
        """
        select, decode_call = (
            (TOKEN_CALL_SELECT, decode_token_call) if tokens_only else (LLM_CALL_SELECT, _decode_pg_call)
        )
        if rollout_ids is not None:
            if isinstance(rollout_ids, str):
                raise TypeError(f"rollout_ids must be a collection of ids, not the string {rollout_ids!r}")
            for rollout_id in dict.fromkeys(rollout_ids):
                yield await self._one_rollout_records(rollout_id, select, decode_call)
            return
        attributed = "WHERE rollout_key > %s"
        async with self._snapshot() as conn:
            rollout_pages = self._cursor_pages(conn, f"SELECT {ROLLOUT_SELECT} FROM rollouts ORDER BY rollout_id", ())
            attempt_pages = self._cursor_pages(
                conn, f"SELECT {ATTEMPT_SELECT} FROM attempts ORDER BY rollout_id, number", ()
            )
            call_pages = self._cursor_pages(
                conn, f"SELECT {select} FROM llm_calls {attributed} ORDER BY {_CALL_ORDER}", (NO_ID,)
            )
            reward_pages = self._cursor_pages(
                conn, f"SELECT {REWARD_SELECT} FROM rewards {attributed} ORDER BY {_RECORD_ORDER}", (NO_ID,)
            )
            async with (
                contextlib.aclosing(rollout_pages),
                contextlib.aclosing(attempt_pages),
                contextlib.aclosing(call_pages),
                contextlib.aclosing(reward_pages),
            ):
                attempts = RolloutCursor(attempt_pages)
                calls, rewards = RolloutCursor(call_pages), RolloutCursor(reward_pages)
                async for page in rollout_pages:
                    for row in page:
                        rollout = decode_rollout(row)
                        rollout_id = rollout.rollout_id
                        yield group_rollout_records(
                            rollout,
                            [decode_attempt(a) for a in await attempts.take(rollout_id)],
                            [decode_call(c) for c in await calls.take(rollout_id)],
                            [decode_reward(r) for r in await rewards.take(rollout_id)],
                        )

    async def _one_rollout_records(
        self, rollout_id: str, call_select: str, decode_call: Callable[[Sequence[Any]], LLMCall]
    ) -> RolloutRecords:
        # One rollout's records are held whole anyway: plain queries on the shared reader.
        rollout = await self.get_rollout(rollout_id)
        if rollout is None:
            raise RolloutNotFoundError(rollout_id)
        attempts = await self.list_attempts(rollout_id)
        calls = await self._fetch(
            f"SELECT {call_select} FROM llm_calls WHERE rollout_key = ? ORDER BY {_CALL_ORDER}", (rollout_id,)
        )
        rewards = await self._fetch(
            f"SELECT {REWARD_SELECT} FROM rewards WHERE rollout_key = ? ORDER BY {_RECORD_ORDER}", (rollout_id,)
        )
        return group_rollout_records(
            rollout, attempts, [decode_call(row) for row in calls], [decode_reward(row) for row in rewards]
        )
