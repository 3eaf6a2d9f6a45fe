"""Group commit: many concurrent writers, one writer thread, one transaction per batch.

Callers `submit` an operation and await its outcome. What all callers submit during one event-loop
iteration is handed to a dedicated writer thread at once, at the end of that iteration; the thread
takes whatever has been handed over (at most `max_batch` operations), runs `apply_batch` on it as
ONE transaction and commits, then gives the outcomes back to the event loop in a single callback,
which resolves each caller's future. So a caller's await returns only after its record is
committed, while the per-transaction cost (the commit, the lock) is shared by everyone who wrote at
the same moment: callers woken by one commit write again together and land in one batch. Under
light load a batch is a single operation and latency is one commit; under heavy load batches grow
on their own, and the thread starts the next batch while the loop wakes the callers of the last.

The thread owns the database connection: `setup` (opening it) runs first on the thread and
`teardown` (closing it) last, so the connection is only ever used from that thread. Handing work
over through a plain thread-safe queue and waking the loop once per batch costs the loop about half
the CPU per write of an asyncio writer task dispatching each batch to an executor (measured ~40 vs
~80 µs for a lone writer), which every served call pays.

The number of operations held in memory (queued or being committed) is bounded by `max_pending`:
when the disk cannot keep up, `submit` waits for room instead of letting memory grow.

Any event loop of the process may submit, not only the one that started the committer (the
owner's): one store object — one writer connection — then serves every thread of a process. A
proxy and a trainer sharing a SQLite file through two connections fought over its write lock
(and failed with "database is locked" on a loaded machine). An operation from another loop goes
straight to the writer thread, which resolves it itself (a thread-safe future the caller's loop
is woken by), so such a caller never waits for the owner's loop: a reward an agent thread emits
commits in the writer's time even while the proxy's loop is busy serving requests. Those
operations are bounded by `max_pending` of their own.

This module knows nothing about SQL: `apply_batch`, `setup` and `teardown` are given by the store.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from agl_bridge.store.errors import StoreClosedError

OpT = TypeVar("OpT")


@dataclass(slots=True)
class Failure:
    """Outcome of an operation that failed; its caller's await raises `error`."""

    error: BaseException


_Item = tuple[Any, "asyncio.Future[Any] | concurrent.futures.Future[Any]"]
"""An operation and its caller's future: an asyncio one of the owner's loop, or a thread-safe one."""
_STOP = None  # put on the queue by `close` once every submitted operation is resolved


class GroupCommitter(Generic[OpT]):
    """Batches operations from concurrent callers into single transactions run on one thread."""

    def __init__(
        self,
        apply_batch: Callable[[list[OpT]], list[Any]],  # one transaction; one outcome (value or Failure) per op
        *,
        max_pending: int,
        max_batch: int,
        setup: Callable[[], None] = lambda: None,
        teardown: Callable[[], None] = lambda: None,
        name: str = "store",
    ) -> None:
        if max_pending < 1 or max_batch < 1:
            raise ValueError(f"max_pending and max_batch must be >= 1, got {max_pending} and {max_batch}")
        self._apply_batch = apply_batch
        self._setup = setup
        self._teardown = teardown
        self._name = name
        self.max_pending = max_pending
        self.max_batch = max_batch
        self._inbox: queue.SimpleQueue[list[_Item] | None] = queue.SimpleQueue()
        self._gathering: list[_Item] | None = None  # ops submitted in this event-loop iteration
        self._loop: asyncio.AbstractEventLoop | None = None
        self._room: asyncio.Semaphore | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Future[None] | None = None
        self._held = 0  # queued or being committed, not yet resolved
        self._unfinished = 0  # submitted and not resolved, including callers waiting for room
        self._closing = False
        self._drained: asyncio.Event | None = None
        # Operations from other loops: their own bound, and a lock ordering their hand-over with `close`.
        self._foreign_room = threading.BoundedSemaphore(max_pending)
        self._foreign_lock = threading.Lock()
        self.batches_committed = 0
        self.ops_committed = 0

    @property
    def pending(self) -> int:
        """Operations held in memory awaiting commit (queued or being committed); at most `max_pending`.

        Callers beyond that wait in `submit` without an operation queued.
        """
        return self._held

    async def start(self) -> None:
        """Start the writer thread (bound to the running loop) and run `setup` on it; its error is raised here."""
        if self._thread is not None:
            return
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._room = asyncio.Semaphore(self.max_pending)
        self._drained = asyncio.Event()
        started: asyncio.Future[None] = loop.create_future()
        self._stopped = loop.create_future()
        self._thread = threading.Thread(
            target=self._work, args=(started,), name=f"agl-{self._name}-writer", daemon=True
        )
        self._thread.start()
        try:
            await started
        except BaseException:
            await asyncio.shield(self._stopped)
            self._thread = None
            raise

    async def submit(self, op: OpT) -> Any:
        """Queue `op` (waiting while `max_pending` are held) and return its outcome once committed.

        From any event loop of the process (see the module docs).
        """
        self._check_open()
        assert self._loop is not None
        if asyncio.get_running_loop() is not self._loop:
            (outcome,) = await self._submit_foreign([op])
            return outcome
        future: asyncio.Future[Any] = self._loop.create_future()
        await self._enqueue(op, future)
        return await future

    async def submit_many(self, ops: Sequence[OpT]) -> list[Any]:
        """Queue several ops (in order) and return their outcomes; raises the first failure."""
        self._check_open()
        assert self._loop is not None
        if asyncio.get_running_loop() is not self._loop:
            return await self._submit_foreign(ops)
        futures: list[asyncio.Future[Any]] = []
        for op in ops:
            future: asyncio.Future[Any] = self._loop.create_future()
            await self._enqueue(op, future)
            futures.append(future)
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return list(outcomes)

    async def close(self) -> None:
        """Stop taking new ops, commit everything already submitted, run `teardown`, end the thread."""
        with self._foreign_lock:  # every op of another loop is now on the queue, or refused
            self._closing = True
        if self._thread is None:
            return
        assert self._drained is not None and self._stopped is not None
        if self._unfinished:
            await self._drained.wait()
        self._inbox.put(_STOP)
        await asyncio.shield(self._stopped)
        self._thread = None

    async def _enqueue(self, op: OpT, future: asyncio.Future[Any]) -> None:
        assert self._room is not None
        self._unfinished += 1
        try:
            await self._room.acquire()
        except BaseException:
            # Cancelled while waiting for room: the op never entered the queue.
            self._finish(1)
            raise
        self._held += 1
        if self._gathering is None:
            # Hand over what all callers submit during this loop iteration at once, when it ends:
            # callers woken together (by one commit) then land in one batch.
            self._gathering = []
            assert self._loop is not None
            self._loop.call_soon(self._hand_over)
        self._gathering.append((op, future))

    def _hand_over(self) -> None:
        items, self._gathering = self._gathering, None
        self._inbox.put(items)

    async def _submit_foreign(self, ops: Sequence[OpT]) -> list[Any]:
        """Submit from a loop other than the owner's: straight to the writer thread, resolved there."""
        futures: list[concurrent.futures.Future[Any]] = []
        unsent: list[_Item] = []  # each holds a unit of room until handed over
        try:
            for op in ops:
                if not self._foreign_room.acquire(blocking=False):
                    self._hand_over_foreign(unsent)  # what is held must commit for room to come back
                    unsent = []
                    await _wait_for_room(self._foreign_room)
                future: concurrent.futures.Future[Any] = concurrent.futures.Future()
                futures.append(future)
                unsent.append((op, future))
            self._hand_over_foreign(unsent)
            unsent = []
        finally:
            for _ in unsent:
                self._foreign_room.release()
        outcomes = await asyncio.gather(*map(asyncio.wrap_future, futures), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return list(outcomes)

    def _hand_over_foreign(self, items: list[_Item]) -> None:
        """Queue other loops' ops for the writer thread (refused once `close` began); the thread frees their room."""
        if not items:
            return
        with self._foreign_lock:
            self._check_open()
            self._inbox.put(items)

    def _check_open(self) -> None:
        if self._closing or self._thread is None:
            raise StoreClosedError(
                f"the {self._name} is not open; use `async with store:` or `await store.open()` before writing"
            )

    def _finish(self, count: int) -> None:
        self._unfinished -= count
        if self._closing and self._unfinished == 0 and self._drained is not None:
            self._drained.set()

    # ------------------------------------------------------------------ the writer thread

    def _work(self, started: asyncio.Future[None]) -> None:
        loop = self._loop
        assert loop is not None and self._stopped is not None
        try:
            self._setup()
        except BaseException as exc:  # reported to start()
            loop.call_soon_threadsafe(_settle, started, exc)
            loop.call_soon_threadsafe(_settle, self._stopped, None)
            return
        loop.call_soon_threadsafe(_settle, started, None)
        try:
            self._commit_until_stopped(loop)
        finally:
            with self._foreign_lock:  # no op of another loop is queued after this
                self._closing = True
            self._refuse_leftovers()
            try:
                self._teardown()
            finally:
                try:
                    loop.call_soon_threadsafe(_settle, self._stopped, None)
                except RuntimeError:  # the loop is already closed: nobody waits for the thread
                    pass

    def _commit_until_stopped(self, loop: asyncio.AbstractEventLoop) -> None:
        inbox = self._inbox
        waiting: list[_Item] = []
        while True:
            if not waiting:
                items = inbox.get()
                if items is _STOP:
                    return
                waiting = items
            while len(waiting) < self.max_batch:
                try:
                    items = inbox.get_nowait()
                except queue.Empty:
                    break
                if items is _STOP:  # not expected (close waits for every op first); honoured after this batch
                    inbox.put(_STOP)
                    break
                waiting += items
            batch, waiting = waiting[: self.max_batch], waiting[self.max_batch :]
            try:
                outcomes = self._apply_batch([op for op, _ in batch])
                if len(outcomes) != len(batch):
                    raise RuntimeError(f"apply_batch returned {len(outcomes)} outcomes for {len(batch)} operations")
            except Exception as exc:  # a bug in apply_batch must fail the callers, not hang them
                outcomes = [Failure(exc)] * len(batch)
            self.batches_committed += 1
            self.ops_committed += len(batch)
            owned: list[tuple[_Item, Any]] = []
            for item, outcome in zip(batch, outcomes, strict=True):
                if isinstance(item[1], concurrent.futures.Future):
                    _settle_threadsafe(item[1], outcome)
                    self._foreign_room.release()
                else:
                    owned.append((item, outcome))
            if owned:
                try:
                    loop.call_soon_threadsafe(self._resolve, owned)
                except RuntimeError:  # the owner's loop is closed: nobody waits for its outcomes any more
                    self._inbox.put(waiting)  # other loops' ops still queued: refused as the thread ends
                    return

    def _refuse_leftovers(self) -> None:
        """Fail the ops of other loops still queued when the thread ends (the owner's loop went away)."""
        closed = StoreClosedError(f"the {self._name} closed before this write was committed; it was not written")
        while True:
            try:
                items = self._inbox.get_nowait()
            except queue.Empty:
                return
            for _, future in items or ():
                if isinstance(future, concurrent.futures.Future):
                    _settle_threadsafe(future, Failure(closed))

    def _resolve(self, owned: list[tuple[_Item, Any]]) -> None:
        assert self._room is not None
        for (_, future), outcome in owned:
            self._room.release()
            if future.done():  # the caller was cancelled; the op was still applied
                continue
            if isinstance(outcome, Failure):
                future.set_exception(outcome.error)
            else:
                future.set_result(outcome)
        self._held -= len(owned)
        self._finish(len(owned))


def _settle_threadsafe(future: concurrent.futures.Future[Any], outcome: Any) -> None:
    """Resolve a thread-safe future with an op's outcome (a caller that gave up is skipped: the op was applied)."""
    if not future.set_running_or_notify_cancel():
        return
    if isinstance(outcome, Failure):
        future.set_exception(outcome.error)
    else:
        future.set_result(outcome)


async def _wait_for_room(room: threading.BoundedSemaphore) -> None:
    """Take one unit of `room`, waiting on a worker thread so the event loop keeps running."""
    waiting = asyncio.ensure_future(asyncio.to_thread(room.acquire))
    try:
        await asyncio.shield(waiting)
    except asyncio.CancelledError:
        waiting.add_done_callback(lambda _: room.release())  # taken after the caller gave up: give it back
        raise


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
