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
unique across processes too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any

import aiosqlite

from agl_bridge._version import __version__
from agl_bridge.store import sqlite_rollouts
from agl_bridge.store.base import group_rollout_records
from agl_bridge.store.codec import encode_json
from agl_bridge.store.errors import RolloutNotFoundError, StoreClosedError, StoreError
from agl_bridge.store.group_commit import GroupCommitter
from agl_bridge.store.sqlite_rows import (
    ATTEMPT_SELECT,
    LLM_CALL_SELECT,
    NO_ID,
    REWARD_SELECT,
    ROLLOUT_SELECT,
    SPAN_SELECT,
    TOKEN_CALL_SELECT,
    decode_attempt,
    decode_llm_call,
    decode_reward,
    decode_rollout,
    decode_span,
    decode_token_call,
    encode_llm_call_rest,
    encode_reward_rest,
    encode_span_rest,
    key_of,
)
from agl_bridge.store.sqlite_writer import FuncOp, RecordOp, SequenceOp, SQLiteWriter, WriteOp, change_waiter
from agl_bridge.types import (
    Attempt,
    AttemptStatus,
    LLMCall,
    Reward,
    Rollout,
    RolloutRecords,
    RolloutStatus,
    RolloutTask,
    StoredSpan,
)

_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_CALL_KEY = ("rollout_key", "attempt_key", "sequence", "choice_index")
_REWARD_KEY = ("rollout_key", "attempt_key", "sequence")
_SPAN_KEY = _REWARD_KEY


class SQLiteStore:
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

    @property
    def pending_writes(self) -> int:
        """Writes held in memory awaiting commit (at most max_pending)."""
        return 0 if self._committer is None else self._committer.pending

    @property
    def write_stats(self) -> dict[str, int]:
        """Transactions and operations committed since open (for benchmarks and monitoring)."""
        if self._committer is None:
            return {"batches": 0, "ops": 0}
        return {"batches": self._committer.batches_committed, "ops": self._committer.ops_committed}

    # --- rollouts and attempts ------------------------------------------------------------------

    async def create_rollout(
        self,
        task: Any,
        *,
        group_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        rollout_id: str | None = None,
    ) -> Rollout:
        """Create a queued rollout of a JSON-able `task`; a fresh time-ordered id when none is given."""
        if rollout_id is None:
            rollout_id = new_id("ro")
        elif not isinstance(rollout_id, str) or not _ID_PATTERN.fullmatch(rollout_id):
            raise ValueError(
                f"rollout_id must be 1-128 letters, digits, '.', '_', ':' or '-' (it appears in URL "
                f"paths), starting with a letter or digit; got {rollout_id!r}"
            )
        if group_id is not None and (not isinstance(group_id, str) or not group_id):
            raise ValueError(f"group_id must be a non-empty string or None, got {group_id!r}")
        if metadata is not None and not isinstance(metadata, dict):
            raise ValueError(f"metadata must be a dict or None, got {metadata!r}")
        task_json = encode_json("task", task)
        metadata_json = encode_json("metadata", metadata or {})
        fn = partial(
            sqlite_rollouts.create_rollout,
            rollout_id=rollout_id,
            task_json=task_json,
            group_id=group_id,
            metadata_json=metadata_json,
            now=time.time(),
        )
        return await self._submit(FuncOp(fn))

    async def get_rollout(self, rollout_id: str) -> Rollout | None:
        """The rollout with this id, or None."""
        rows = await self._fetch(f"SELECT {ROLLOUT_SELECT} FROM rollouts WHERE rollout_id = ?", (rollout_id,))
        return decode_rollout(rows[0]) if rows else None

    async def list_rollouts(
        self,
        *,
        status: RolloutStatus | Iterable[RolloutStatus] | None = None,
        group_id: str | None = None,
        limit: int | None = None,
        eval: bool | None = None,
        consumed: bool | None = None,
        created_since: float | None = None,
    ) -> list[Rollout]:
        """Rollouts in creation order, filtered by status (one or several), group, eval flag, whether a
        follow trainer took them, and creation time (at or after `created_since`)."""
        clauses: list[str] = []
        params: list[Any] = []
        if eval is not None:
            clauses.append("eval = ?")
            params.append(int(eval))
        if consumed is not None:
            clauses.append("consumed_step IS NOT NULL" if consumed else "consumed_step IS NULL")
        if created_since is not None:
            clauses.append("created_at >= ?")
            params.append(float(created_since))
        if status is not None:
            statuses = [status] if isinstance(status, (str, RolloutStatus)) else list(status)
            values = [RolloutStatus(s).value for s in statuses]
            if not values:
                return []
            clauses.append(f"status IN ({', '.join('?' for _ in values)})")
            params.extend(values)
        if group_id is not None:
            clauses.append("group_id = ?")
            params.append(group_id)
        sql = f"SELECT {ROLLOUT_SELECT} FROM rollouts"
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        sql += " ORDER BY rowid"
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
                raise ValueError(f"limit must be an integer >= 0 or None, got {limit!r}")
            sql += " LIMIT ?"
            params.append(limit)
        return [decode_rollout(row) for row in await self._fetch(sql, params)]

    async def set_rollout_status(self, rollout_id: str, status: RolloutStatus) -> Rollout:
        """Move a rollout along queued → running → succeeded|failed|timed_out (or running → queued).

        Raises InvalidTransitionError naming both statuses if the move is illegal, and
        RolloutNotFoundError for an unknown id.
        """
        status = RolloutStatus(status)
        fn = partial(sqlite_rollouts.set_rollout_status, rollout_id=rollout_id, status=status, now=time.time())
        return await self._submit(FuncOp(fn))

    async def start_attempt(self, rollout_id: str) -> Attempt:
        """Start the next attempt (fresh "at-…" id, numbers from 1) of a queued or running rollout."""
        attempt_id = new_id("at")
        fn = partial(sqlite_rollouts.start_attempt, rollout_id=rollout_id, attempt_id=attempt_id, now=time.time())
        return await self._submit(FuncOp(fn))

    async def finish_attempt(
        self,
        attempt_id: str,
        status: AttemptStatus,
        *,
        error: str | None = None,
        traceback: str | None = None,
        rollout_id: str | None = None,
    ) -> Attempt:
        """Record a running attempt's outcome and error text; the rollout's status is set separately.

        rollout_id: the attempt's rollout; needed only when several rollouts use this attempt id.
        """
        fn = partial(
            sqlite_rollouts.finish_attempt,
            attempt_id=attempt_id,
            status=_final_status(status, "finish_attempt"),
            error=error,
            traceback=traceback,
            now=time.time(),
            rollout_id=rollout_id,
        )
        return await self._submit(FuncOp(fn))

    async def get_attempt(self, attempt_id: str, rollout_id: str | None = None) -> Attempt | None:
        """The attempt with this id (of `rollout_id`, when given), or None."""
        if rollout_id is None:
            rows = await self._fetch(f"SELECT {ATTEMPT_SELECT} FROM attempts WHERE attempt_id = ?", (attempt_id,))
        else:
            rows = await self._fetch(
                f"SELECT {ATTEMPT_SELECT} FROM attempts WHERE rollout_id = ? AND attempt_id = ?",
                (rollout_id, attempt_id),
            )
        return decode_attempt(rows[0]) if rows else None

    # --- rollouts run by clients we do not launch -----------------------------------------------

    async def register_attempt(self, rollout_id: str, attempt_id: str, task: RolloutTask | None = None) -> Rollout:
        """Start (rollout, attempt) for an outside harness, naming its task; the rollout as it now is.

        Registers both as running if new (origin external). AttemptFinishedError if the attempt or
        its rollout is finished; TaskConflictError if the rollout belongs to another task.
        """
        _check_ids(rollout_id, attempt_id)
        fn = partial(sqlite_rollouts.register_attempt, rollout_id=rollout_id, attempt_id=attempt_id, task=task)
        return await self._submit(FuncOp(partial(fn, now=time.time())))

    async def complete_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus,
        *,
        error: str | None = None,
        task: RolloutTask | None = None,
    ) -> Rollout:
        """Finish an attempt with its outcome (naming its task first); its rollout ends with its last attempt.

        The rollout becomes succeeded if any of its attempts succeeded, else this outcome, once
        none of its attempts is running. AttemptNotFoundError for an unknown (rollout, attempt),
        AttemptFinishedError for a finished one, TaskConflictError for another task.
        """
        _check_ids(rollout_id, attempt_id)
        fn = partial(
            sqlite_rollouts.complete_attempt,
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            status=_final_status(status, "complete_attempt"),
            error=error,
            task=task,
            now=time.time(),
        )
        return await self._submit(FuncOp(fn))

    async def report_reward(self, reward: Reward) -> int:
        """Durably store a reward a client reports for a live attempt; returns its sequence.

        As `add_reward` (a new (rollout, attempt) is registered), but a reward for a finished attempt
        or rollout is refused with AttemptFinishedError instead of stored: it would train nothing.
        """
        if reward.rollout_id is None or reward.attempt_id is None:
            raise ValueError("report_reward needs the reward's rollout_id and attempt_id")
        op = _reward_op(reward)
        op.live_attempt = True
        return await self._submit(op)

    async def expire_idle_rollouts(self, idle_s: float) -> list[tuple[str, str | None]]:
        """Time out external rollouts with no call, reward or request for `idle_s` seconds.

        Their running attempts become timed_out (error text naming the timeout), their rollouts
        timed_out (or succeeded, if another attempt succeeded). Returns the (rollout, attempt) pairs
        timed out (attempt None: a rollout with records outside any attempt only).
        """
        if not idle_s > 0:
            raise ValueError(f"idle_s must be > 0, got {idle_s!r}")
        now = time.time()
        error = f"no call, reward or request for {idle_s:g} s (the rollout idle timeout); it will never train"
        fn = partial(sqlite_rollouts.expire_idle, cutoff=now - idle_s, now=now, error=error)
        return await self._submit(FuncOp(fn))

    async def mark_consumed(self, rollout_ids: Sequence[str], step: int) -> int:
        """Mark rollouts as taken by a follow trainer's step `step` (not those taken already); returns how many."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an integer >= 0, got {step!r}")
        ids = list(rollout_ids)
        return await self._submit(FuncOp(partial(sqlite_rollouts.mark_consumed, rollout_ids=ids, step=step)))

    async def release_consumed(self, after_step: int) -> int:
        """Un-take what steps after `after_step` took (resuming from that step's checkpoint); returns how many."""
        return await self._submit(FuncOp(partial(sqlite_rollouts.release_consumed, after_step=after_step)))

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

    async def list_attempts(self, rollout_id: str) -> list[Attempt]:
        """A rollout's attempts, first to last."""
        rows = await self._fetch(
            f"SELECT {ATTEMPT_SELECT} FROM attempts WHERE rollout_id = ? ORDER BY number", (rollout_id,)
        )
        return [decode_attempt(row) for row in rows]

    # --- sequence numbers and records -----------------------------------------------------------

    async def next_sequence(self, rollout_id: str | None, attempt_id: str | None) -> int:
        """Allocate the next sequence of (rollout, attempt) (None, None: the "no rollout" space).

        Numbers start at 0, only increase, are never handed out twice (across processes too) and
        are committed before this returns. They may have gaps.
        """
        if attempt_id is not None and rollout_id is None:
            raise ValueError(f"attempt_id {attempt_id!r} was given without a rollout_id; pass both or neither")
        rollout_key, attempt_key = key_of(rollout_id, attempt_id)
        return await self._submit(SequenceOp(rollout_key, attempt_key))

    async def add_llm_call(self, call: LLMCall) -> int:
        """Durably store one call; returns its sequence (allocated if `call.sequence` is None).

        A call whose `span_id` is already stored is not stored again (re-delivered span); the
        stored call's sequence is returned. DuplicateRecordError if another call already holds
        the same (rollout, attempt, sequence, choice_index).
        """
        return await self._submit(_call_op(call))

    async def add_llm_calls(self, calls: Sequence[LLMCall]) -> list[int]:
        """Durably store several calls; returns their sequences in order.

        Each call is committed on its own merits: if one fails, the others are still stored and
        the first failure is raised once all have been processed.
        """
        ops = [_call_op(call) for call in calls]
        return await self._submit_many(ops)

    async def add_reward(self, reward: Reward) -> int:
        """Durably store one reward; returns its sequence (allocated if `reward.sequence` is None)."""
        return await self._submit(_reward_op(reward))

    async def add_rewards(self, rewards: Sequence[Reward]) -> list[int]:
        """Durably store several rewards; returns their sequences in order (see add_llm_calls)."""
        ops = [_reward_op(reward) for reward in rewards]
        return await self._submit_many(ops)

    async def add_span(self, span: StoredSpan) -> int:
        """Durably store one generic span; returns its sequence (allocated if `span.sequence` is None).

        A span whose `span_id` is already stored is not stored again (an exporter retrying); the
        stored span's sequence is returned.
        """
        return await self._submit(_span_op(span))

    async def add_spans(self, spans: Sequence[StoredSpan]) -> list[int]:
        """Durably store several generic spans; returns their sequences in order (see add_llm_calls)."""
        ops = [_span_op(span) for span in spans]
        return await self._submit_many(ops)

    async def iter_llm_calls(
        self, rollout_id: str | None = None, attempt_id: str | None = None
    ) -> AsyncIterator[LLMCall]:
        """Stream calls in (rollout, attempt, sequence, choice_index) order.

        rollout_id and attempt_id given: that attempt's calls; rollout_id only: every attempt of
        that rollout; neither: every call that belongs to a rollout (see iter_all_calls for
        calls outside rollouts too).
        """
        fixed = _leading_key(rollout_id, attempt_id)
        async for row in self._stream("llm_calls", LLM_CALL_SELECT, _CALL_KEY, fixed, attributed_only=True):
            yield decode_llm_call(row)

    async def iter_rewards(self, rollout_id: str | None = None, attempt_id: str | None = None) -> AsyncIterator[Reward]:
        """Stream rewards in (rollout, attempt, sequence) order; filters as in iter_llm_calls."""
        fixed = _leading_key(rollout_id, attempt_id)
        async for row in self._stream("rewards", REWARD_SELECT, _REWARD_KEY, fixed, attributed_only=True):
            yield decode_reward(row)

    async def iter_spans(
        self, rollout_id: str | None = None, attempt_id: str | None = None
    ) -> AsyncIterator[StoredSpan]:
        """Stream generic spans in (rollout, attempt, sequence) order; filters as in iter_llm_calls."""
        fixed = _leading_key(rollout_id, attempt_id)
        async for row in self._stream("spans", SPAN_SELECT, _SPAN_KEY, fixed, attributed_only=True):
            yield decode_span(row)

    async def iter_all_calls(self) -> AsyncIterator[LLMCall]:
        """Stream every call, those outside any rollout first, for exports."""
        async for row in self._stream("llm_calls", LLM_CALL_SELECT, _CALL_KEY, (), attributed_only=False):
            yield decode_llm_call(row)

    async def iter_all_rewards(self) -> AsyncIterator[Reward]:
        """Stream every reward, those outside any rollout first."""
        async for row in self._stream("rewards", REWARD_SELECT, _REWARD_KEY, (), attributed_only=False):
            yield decode_reward(row)

    async def iter_all_spans(self) -> AsyncIterator[StoredSpan]:
        """Stream every generic span, those outside any rollout first."""
        async for row in self._stream("spans", SPAN_SELECT, _SPAN_KEY, (), attributed_only=False):
            yield decode_span(row)

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
        call_pages = self._pages("llm_calls", select, _CALL_KEY, (), attributed_only=True, prefetch=True)
        reward_pages = self._pages("rewards", REWARD_SELECT, _REWARD_KEY, (), attributed_only=True, prefetch=True)
        async with contextlib.aclosing(call_pages), contextlib.aclosing(reward_pages):
            calls, rewards = _RolloutCursor(call_pages), _RolloutCursor(reward_pages)
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
            async for row in self._stream("llm_calls", call_select, _CALL_KEY, fixed, attributed_only=True)
        ]
        rewards = [
            decode_reward(row)
            async for row in self._stream("rewards", REWARD_SELECT, _REWARD_KEY, fixed, attributed_only=True)
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

    def _require_committer(self) -> GroupCommitter[WriteOp]:
        if self._committer is None:
            raise StoreClosedError(
                f"store {self.path} is not open; use `async with store:` or `await store.open()` first"
            )
        return self._committer

    async def _submit(self, op: WriteOp) -> Any:
        return await self._require_committer().submit(op)

    async def _submit_many(self, ops: Sequence[WriteOp]) -> list[Any]:
        return await self._require_committer().submit_many(ops)

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


class _RolloutCursor:
    """Rows of one ordered page stream (column 0: the rollout key), handed out rollout by rollout."""

    def __init__(self, pages: AsyncIterator[list[Any]]) -> None:
        self._pages = pages
        self._rows: list[Any] = []
        self._at = 0
        self._done = False

    async def take(self, rollout_id: str) -> list[Any]:
        """The rows of `rollout_id`, skipping rows of earlier rollouts (ids must come ascending)."""
        taken: list[Any] = []
        while True:
            rows, at, n = self._rows, self._at, len(self._rows)
            while at < n and rows[at][0] < rollout_id:
                at += 1
            start = at
            while at < n and rows[at][0] == rollout_id:
                at += 1
            taken.extend(rows[start:at])
            self._at = at
            if at < n or self._done:
                return taken
            page = await anext(self._pages, None)  # this rollout's rows may go on in the next page
            if page is None:
                self._done = True
                return taken
            self._rows, self._at = page, 0


_id_clock = threading.Lock()
_id_last_ms = 0
_id_count = 0


def new_id(prefix: str) -> str:
    """A fresh id like "ro-0192f3a4b5c6000ad7e8f9a0": creation time in ms, a per-ms counter, 32 random bits.

    Time first so that ids made together sort together: the records of the rollouts running at
    one moment then land in neighbouring index pages, which made inserts about 40% cheaper than
    with purely random ids in our measurements. The counter keeps the ids one process makes in
    creation order within a millisecond; the random part keeps ids unique across processes.
    """
    global _id_last_ms, _id_count
    with _id_clock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms > _id_last_ms:
            _id_last_ms, _id_count = now_ms, 0
        else:  # same millisecond (or the clock stepped back): keep counting after the last id
            _id_count += 1
        stamp = f"{_id_last_ms:012x}{_id_count:04x}"
    return f"{prefix}-{stamp}{secrets.token_hex(4)}"


def _check_ids(rollout_id: str, attempt_id: str) -> None:
    for name, value in (("rollout_id", rollout_id), ("attempt_id", attempt_id)):
        if not isinstance(value, str) or not _ID_PATTERN.fullmatch(value):
            raise ValueError(
                f"{name} must be 1-128 letters, digits, '.', '_', ':' or '-', starting with a letter or digit; "
                f"got {value!r}"
            )


def _final_status(status: AttemptStatus | str, method: str) -> AttemptStatus:
    final = AttemptStatus(status)
    if not final.is_final:
        raise ValueError(f"{method} needs a final status (succeeded, failed or timed_out), got {final.value!r}")
    return final


def _leading_key(rollout_id: str | None, attempt_id: str | None) -> tuple[str, ...]:
    """Values of the leading ordering-key columns a stream is restricted to."""
    if rollout_id is None:
        if attempt_id is not None:
            raise ValueError(f"attempt_id {attempt_id!r} was given without its rollout_id; pass the rollout_id too")
        return ()
    if attempt_id is None:
        return (rollout_id,)
    return (rollout_id, attempt_id)


def _call_op(call: LLMCall) -> RecordOp:
    if not isinstance(call, LLMCall):
        raise TypeError(f"expected an LLMCall record, got {type(call).__name__}")
    rollout_key, attempt_key = key_of(call.rollout_id, call.attempt_id)
    return RecordOp("llm_calls", rollout_key, attempt_key, call.sequence, call.span_id, encode_llm_call_rest(call))


def _reward_op(reward: Reward) -> RecordOp:
    if not isinstance(reward, Reward):
        raise TypeError(f"expected a Reward record, got {type(reward).__name__}")
    rollout_key, attempt_key = key_of(reward.rollout_id, reward.attempt_id)
    return RecordOp("rewards", rollout_key, attempt_key, reward.sequence, reward.span_id, encode_reward_rest(reward))


def _span_op(span: StoredSpan) -> RecordOp:
    if not isinstance(span, StoredSpan):
        raise TypeError(f"expected a StoredSpan record, got {type(span).__name__}")
    rollout_key, attempt_key = key_of(span.rollout_id, span.attempt_id)
    return RecordOp("spans", rollout_key, attempt_key, span.sequence, span.span_id, encode_span_rest(span))
