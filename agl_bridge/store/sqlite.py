"""`SQLiteStore`: the default store, one SQLite file in WAL mode, written with group commit.

Durability (invariant 4, "a span accepted with 2xx is durable"): every write call returns only
after the transaction holding its record has committed. With the default `synchronous="NORMAL"`
in WAL mode a committed transaction survives a crash of any process (the data is in the WAL file,
written before COMMIT returns), but the last transactions may be lost — never corrupted — on an OS
crash or power loss, because the WAL is not fsynced at every commit. That is the trade we take by
default: it covers the failure the invariant is about (a proxy, runner or trainer process dying)
and keeps a lone writer's commit at ~0.1 ms. Pass `synchronous="FULL"` to fsync at every commit
and survive power loss too: measured on a 2-core VM with ext4, a lone writer drops from ~9,000 to
~1,200 commits/s, but with 64 concurrent writers group commit shares each fsync across the batch
and ingest drops only ~12%.

Concurrency: all writes of one store object go through one writer thread and one plain sqlite3
connection (`GroupCommitter` + `SQLiteWriter`), so a whole batch transaction runs as one call on
that thread (aiosqlite has no public way to do that; one thread hop per statement would cost more
and let other writes interleave with an open batch). Reads use a separate aiosqlite connection and page through
results with keyset queries, so a long export neither holds a read transaction open (which would
stop WAL checkpoints and let the WAL grow) nor loads a table into memory. Several processes may
open the same file: SQLite's write lock (waited on up to `busy_timeout_s`) serialises their
transactions, and sequence allocation happens inside the locked transaction, so numbers stay
unique across processes too. Within a process, share one store object instead (it serves every
event loop and thread: `group_commit.py`, and aiosqlite's reader is loop-agnostic): two
connections of one process would only contend with each other for that lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sqlite3
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import aiosqlite

from agl_bridge._version import __version__
from agl_bridge.store.base import group_rollout_records
from agl_bridge.store.batched import CALL_KEY, RECORD_KEY, BatchedStore, RolloutCursor
from agl_bridge.store.errors import RolloutNotFoundError, StoreClosedError, StoreError
from agl_bridge.store.group_commit import GroupCommitter
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
from agl_bridge.store.sqlite_writer import SQLiteWriter, WriteOp, change_waiter
from agl_bridge.types import (
    Attempt,
    LLMCall,
    Rollout,
    RolloutRecords,
)

_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


class SQLiteStore(BatchedStore):
    """A `Store` in one SQLite file; use as `async with SQLiteStore(path) as store:`.

    path: the database file; created with mode 0600 (parent directories too) if missing.
    synchronous: "NORMAL" (default; survives process crashes) or "FULL" (also power loss).
    busy_timeout_s: how long a write waits for another process's write lock before failing with
      StoreWriteError.
    max_pending: most writes held in memory (queued or being committed); further writers wait
      (backpressure).
    max_batch: most writes committed in one transaction.
    read_page_size: rows fetched per query while streaming.
    max_db_bytes: optional size cap; writes past it fail with StoreWriteError ("database or disk
      is full") instead of filling the disk.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "NORMAL",
        busy_timeout_s: float = 5.0,
        max_pending: int = 4096,
        max_batch: int = 512,
        read_page_size: int = 256,
        max_db_bytes: int | None = None,
    ) -> None:
        if str(path) in ("", ":memory:"):
            raise ValueError(
                "SQLiteStore needs a file path (its reader and writer use separate connections, "
                "which cannot share an in-memory database); use a temporary file instead"
            )
        if read_page_size < 1:
            raise ValueError(f"read_page_size must be >= 1, got {read_page_size}")
        self.path = str(path)
        self.where = self.path
        self._busy_timeout_s = busy_timeout_s
        self._max_pending = max_pending
        self._max_batch = max_batch
        self._page = read_page_size
        self._writer = SQLiteWriter(
            self.path,
            synchronous=synchronous.upper(),
            busy_timeout_s=busy_timeout_s,
            max_db_bytes=max_db_bytes,
            created_by=f"agl_bridge {__version__}",
        )
        self._committer: GroupCommitter[WriteOp] | None = None
        self._reader: aiosqlite.Connection | None = None

    # --- lifecycle --------------------------------------------------------------------------------

    async def open(self) -> None:
        """Create or open the file, check its schema version, start the writer."""
        if self._committer is not None:
            return
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        committer: GroupCommitter[WriteOp] = GroupCommitter(
            self._writer.apply_batch,
            max_pending=self._max_pending,
            max_batch=self._max_batch,
            setup=self._writer.connect,
            teardown=self._writer.close,
            name=f"store {self.path}",
        )
        await committer.start()  # opens the write connection on the writer thread
        reader: aiosqlite.Connection | None = None
        try:
            reader = await aiosqlite.connect(self.path, timeout=self._busy_timeout_s, isolation_level=None)
            await reader.execute("PRAGMA query_only = ON")
        except BaseException:
            if reader is not None:
                await reader.close()
            await committer.close()
            raise
        self._reader = reader
        self._committer = committer

    async def close(self) -> None:
        """Commit every submitted write, then close both connections and the writer thread."""
        committer, self._committer = self._committer, None
        if committer is None:
            return
        await committer.close()
        if self._reader is not None:
            await self._reader.close()
            self._reader = None

    async def __aenter__(self) -> SQLiteStore:
        """Open the store and return it."""
        await self.open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Close the store."""
        await self.close()

    async def change_token(self) -> int:
        """A mark of the store's state now, for `wait_for_change(since=...)`: take it before reading."""
        return await self._data_version()

    async def wait_for_change(self, timeout_s: float, *, since: int | None = None, poll_s: float = 0.25) -> bool:
        """Wait until a rollout or attempt may have changed; False once `timeout_s` passed without a sign.

        since: a `change_token()` taken before the caller read the state it waits to see change; a
        change committed after it returns at once (without it, only changes after this call count,
        and one committed between the caller's read and this call is missed until `timeout_s`).
        A state change committed by a store object of this process on the same file wakes the
        waiter at once; writes of other processes are noticed within `poll_s` (SQLite's
        `data_version` of the reading connection, which any other connection's commit moves:
        records too). Never spins.
        """
        deadline = time.monotonic() + timeout_s
        with change_waiter(self.path) as changed:  # registered before the check: no change falls in between
            seen = await self._data_version()
            if since is not None and seen != since:
                return True
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                try:
                    await asyncio.wait_for(changed.wait(), min(poll_s, left))
                    return True
                except TimeoutError:
                    pass
                if await self._data_version() != seen:
                    return True

    async def _data_version(self) -> int:
        rows = await self._fetch("PRAGMA data_version", ())
        return int(rows[0][0])

    async def iter_rollout_records(
        self, rollout_ids: Iterable[str] | None = None, *, tokens_only: bool = False
    ) -> AsyncIterator[RolloutRecords]:
        """Stream rollouts one at a time with their attempts, calls and rewards (see `Store`).

        The whole-store walk (rollout_ids None) reads rollouts a page at a time with one attempts
        query per page, and merges them with one ordered page stream of calls and one of rewards:
        a handful of queries per page of rollouts instead of four per rollout. Each stream asks
        for its next page before the current one is handed over, so the reader thread fetches
        while this one decodes. Memory: two pages of rows per table plus the current rollout.
        """
        # Token-only readers skip the message JSON and text columns and get arrays, not lists: most
        # of the cost of reading a call is building its Python objects.
        select, decode_call = (
            (TOKEN_CALL_SELECT, decode_token_call) if tokens_only else (LLM_CALL_SELECT, decode_llm_call)
        )
        if rollout_ids is not None:
            if isinstance(rollout_ids, str):
                raise TypeError(f"rollout_ids must be a collection of ids, not the string {rollout_ids!r}")
            for rollout_id in dict.fromkeys(rollout_ids):
                yield await self._one_rollout_records(rollout_id, select, decode_call)
            return
        call_pages = self._pages("llm_calls", select, CALL_KEY, (), attributed_only=True, prefetch=True)
        reward_pages = self._pages("rewards", REWARD_SELECT, RECORD_KEY, (), attributed_only=True, prefetch=True)
        async with contextlib.aclosing(call_pages), contextlib.aclosing(reward_pages):
            calls, rewards = RolloutCursor(call_pages), RolloutCursor(reward_pages)
            async for rollout, attempts in self._rollout_pages():
                rollout_id = rollout.rollout_id
                rollout_calls = [decode_call(row) for row in await calls.take(rollout_id)]
                rollout_rewards = [decode_reward(row) for row in await rewards.take(rollout_id)]
                yield group_rollout_records(rollout, attempts, rollout_calls, rollout_rewards)

    async def _one_rollout_records(
        self, rollout_id: str, call_select: str, decode_call: Callable[[Sequence[Any]], LLMCall]
    ) -> RolloutRecords:
        rollout = await self.get_rollout(rollout_id)
        if rollout is None:
            raise RolloutNotFoundError(rollout_id)
        attempts = await self.list_attempts(rollout_id)
        fixed = (rollout_id,)
        calls = [
            decode_call(row)
            async for row in self._stream("llm_calls", call_select, CALL_KEY, fixed, attributed_only=True)
        ]
        rewards = [
            decode_reward(row)
            async for row in self._stream("rewards", REWARD_SELECT, RECORD_KEY, fixed, attributed_only=True)
        ]
        return group_rollout_records(rollout, attempts, calls, rewards)

    async def _rollout_pages(self) -> AsyncIterator[tuple[Rollout, list[Attempt]]]:
        """Every rollout in rollout id order with its attempts, fetched a page of rollouts at a time."""
        last: str | None = None
        args: list[Any]
        while True:
            if last is None:
                sql, args = f"SELECT {ROLLOUT_SELECT} FROM rollouts ORDER BY rollout_id LIMIT ?", [self._page]
            else:
                sql = f"SELECT {ROLLOUT_SELECT} FROM rollouts WHERE rollout_id > ? ORDER BY rollout_id LIMIT ?"
                args = [last, self._page]
            rows = await self._fetch(sql, args)
            if not rows:
                return
            ids = [row[0] for row in rows]
            marks = ", ".join("?" for _ in ids)
            attempt_rows = await self._fetch(
                f"SELECT {ATTEMPT_SELECT} FROM attempts WHERE rollout_id IN ({marks}) ORDER BY rollout_id, number",
                ids,
            )
            attempts: dict[str, list[Attempt]] = {}
            for attempt_row in attempt_rows:
                attempts.setdefault(attempt_row[0], []).append(decode_attempt(attempt_row))
            for row in rows:
                yield decode_rollout(row), attempts.get(row[0], [])
            if len(rows) < self._page:
                return
            last = ids[-1]

    # --- internals --------------------------------------------------------------------------------

    async def _fetch(self, sql: str, params: Sequence[Any]) -> list[Any]:
        reader = self._reader
        if reader is None:
            raise StoreClosedError(
                f"store {self.path} is not open; use `async with store:` or `await store.open()` first"
            )
        try:
            return list(await reader.execute_fetchall(sql, params))
        except sqlite3.Error as exc:
            raise StoreError(f"could not read store {self.path}: {exc}") from exc

    async def _stream(
        self, table: str, select: str, key: tuple[str, ...], fixed: Sequence[str], *, attributed_only: bool
    ) -> AsyncIterator[Sequence[Any]]:
        pages = self._pages(table, select, key, fixed, attributed_only=attributed_only)
        async with contextlib.aclosing(pages):
            async for rows in pages:
                for row in rows:
                    yield row

    async def _pages(
        self,
        table: str,
        select: str,
        key: tuple[str, ...],
        fixed: Sequence[str],
        *,
        attributed_only: bool,
        prefetch: bool = False,
    ) -> AsyncGenerator[list[Any], None]:
        # Keyset pagination over the ordering index `key`. `fixed` holds values for the leading
        # key columns (a rollout, or a rollout and attempt). Each page is its own short query that
        # resumes after the last key seen, phrased as "leading columns = fixed values AND (the
        # other key columns) > (last values)" so SQLite seeks straight to the resume point in the
        # index instead of filtering from the start (which would make a long walk quadratic).
        # Rows added during the walk that sort after the cursor are included. With `prefetch`,
        # the next page's query is sent before a page is yielded (at most one in flight).
        n_fixed = len(fixed)
        equal = [f"{column} = ?" for column in key[:n_fixed]]
        rest = key[n_fixed:]
        order = ", ".join(key)
        after = f"({', '.join(rest)}) > ({', '.join('?' for _ in rest)})"

        def page_query(last: Sequence[Any] | None) -> tuple[str, list[Any]]:
            where = list(equal)
            args: list[Any] = list(fixed)
            if last is not None:
                where.append(after)
                args.extend(last[n_fixed:])
            elif attributed_only and n_fixed == 0:
                where.append("rollout_key > ?")  # first page only: later pages resume past it
                args.append(NO_ID)
            sql = f"SELECT {select} FROM {table}"
            if where:
                sql += " WHERE " + " AND ".join(where)
            sql += f" ORDER BY {order} LIMIT ?"
            args.append(self._page)
            return sql, args

        pending: asyncio.Future[list[Any]] | None = None
        try:
            rows = await self._fetch(*page_query(None))
            while True:
                full = len(rows) == self._page
                if full and prefetch:
                    pending = asyncio.ensure_future(self._fetch(*page_query(rows[-1][: len(key)])))
                if rows:
                    yield rows
                if not full:
                    return
                if pending is not None:
                    rows, pending = await pending, None
                else:
                    rows = await self._fetch(*page_query(rows[-1][: len(key)]))
        finally:
            if pending is not None:  # left early with a page in flight: let it finish, drop it
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, StoreError):
                    await pending
