"""Group commit: many concurrent writers, one writer task, one transaction per batch.

Callers `submit` an operation and await its outcome. One writer task takes whatever has queued up
(at most `max_batch` operations), hands the batch to `apply_batch` on a dedicated worker thread
(which runs it as ONE transaction and commits), and only then resolves each caller's future. So a
caller's await returns only after its record is committed, while the per-transaction cost (the
commit, the lock) is shared by everyone who wrote at the same moment. Under light load a batch is a
single operation and latency is one commit; under heavy load batches grow on their own.

The queue is bounded (`max_pending`): when the disk cannot keep up, `submit` waits for room instead
of letting memory grow. At most `max_pending` operations wait in the queue, plus one batch being
committed and the next one taken off the queue (`max_batch` each).

This module knows nothing about SQL: `apply_batch` is given by the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from agl_bridge.store.errors import StoreClosedError

OpT = TypeVar("OpT")


@dataclass(slots=True)
class Failure:
    """Outcome of an operation that failed; its caller's await raises `error`."""

    error: BaseException


ApplyBatch = Callable[[list[Any]], list[Any]]
"""Runs a batch in one transaction; returns one outcome per operation (a value or a Failure)."""


class GroupCommitter(Generic[OpT]):
    """Batches operations from concurrent callers into single transactions run on one thread."""

    def __init__(
        self,
        apply_batch: Callable[[list[OpT]], list[Any]],
        executor: ThreadPoolExecutor,
        *,
        max_pending: int,
        max_batch: int,
        name: str = "store",
    ) -> None:
        if max_pending < 1 or max_batch < 1:
            raise ValueError(f"max_pending and max_batch must be >= 1, got {max_pending} and {max_batch}")
        self._apply_batch = apply_batch
        self._executor = executor
        self._name = name
        self.max_pending = max_pending
        self.max_batch = max_batch
        self._queue: asyncio.Queue[tuple[OpT, asyncio.Future[Any]]] = asyncio.Queue(maxsize=max_pending)
        self._unfinished = 0  # submitted and not resolved, including callers waiting for room
        self._in_flight = 0  # ops taken off the queue and not yet resolved
        self._closing = False
        self._drained = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.batches_committed = 0
        self.ops_committed = 0

    @property
    def pending(self) -> int:
        """Operations held in memory awaiting commit: queued plus being committed.

        Never more than `max_pending + 2 * max_batch` (the queue, the batch committing and the
        next batch taken off the queue); callers beyond that wait in `submit` without an op queued.
        """
        return self._queue.qsize() + self._in_flight

    def start(self) -> None:
        """Start the writer task on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"{self._name}-group-commit")

    async def submit(self, op: OpT) -> Any:
        """Queue `op` (waiting while the queue is full) and return its outcome once committed."""
        self._check_open()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._unfinished += 1
        try:
            await self._queue.put((op, future))
        except BaseException:
            # Cancelled while waiting for room: the op never entered the queue.
            self._finish(1)
            raise
        return await future

    async def submit_many(self, ops: Sequence[OpT]) -> list[Any]:
        """Queue several ops (in order) and return their outcomes; raises the first failure."""
        self._check_open()
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Any]] = []
        for op in ops:
            future: asyncio.Future[Any] = loop.create_future()
            self._unfinished += 1
            try:
                await self._queue.put((op, future))
            except BaseException:
                self._finish(1)
                raise
            futures.append(future)
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return list(outcomes)

    async def close(self) -> None:
        """Stop taking new ops, commit everything already submitted, then stop the writer task."""
        self._closing = True
        if self._unfinished:
            await self._drained.wait()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def _check_open(self) -> None:
        if self._closing or self._task is None:
            raise StoreClosedError(
                f"the {self._name} is not open; use `async with store:` or `await store.open()` before writing"
            )

    def _finish(self, count: int) -> None:
        self._unfinished -= count
        if self._closing and self._unfinished == 0:
            self._drained.set()

    async def _run(self) -> None:
        # Double-buffered: as soon as one batch has committed, whatever queued meanwhile starts
        # committing on the thread, and only then are the finished batch's callers woken. So the
        # thread commits batch k+1 while the event loop runs batch k's callers, instead of the
        # two taking turns.
        loop = asyncio.get_running_loop()
        in_flight: tuple[list[tuple[OpT, asyncio.Future[Any]]], asyncio.Future[list[Any]]] | None = None
        while True:
            if in_flight is None:
                batch = [await self._queue.get()]
                self._drain_into(batch)
                in_flight = (batch, self._dispatch(loop, batch))
            batch, committing = in_flight
            try:
                outcomes = await committing
                if len(outcomes) != len(batch):
                    raise RuntimeError(f"apply_batch returned {len(outcomes)} outcomes for {len(batch)} operations")
            except Exception as exc:  # a bug in apply_batch must fail the callers, not hang them
                outcomes = [Failure(exc)] * len(batch)
            following: list[tuple[OpT, asyncio.Future[Any]]] = []
            self._drain_into(following)
            in_flight = (following, self._dispatch(loop, following)) if following else None
            self._resolve(batch, outcomes)

    def _drain_into(self, batch: list[tuple[OpT, asyncio.Future[Any]]]) -> None:
        queue = self._queue
        while len(batch) < self.max_batch:
            try:
                batch.append(queue.get_nowait())
            except asyncio.QueueEmpty:
                return

    def _dispatch(
        self, loop: asyncio.AbstractEventLoop, batch: list[tuple[OpT, asyncio.Future[Any]]]
    ) -> asyncio.Future[list[Any]]:
        self._in_flight += len(batch)
        return loop.run_in_executor(self._executor, self._apply_batch, [op for op, _ in batch])

    def _resolve(self, batch: list[tuple[OpT, asyncio.Future[Any]]], outcomes: list[Any]) -> None:
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if future.done():  # the caller was cancelled; the op was still applied
                continue
            if isinstance(outcome, Failure):
                future.set_exception(outcome.error)
            else:
                future.set_result(outcome)
        self.batches_committed += 1
        self.ops_committed += len(batch)
        self._in_flight -= len(batch)
        self._finish(len(batch))
