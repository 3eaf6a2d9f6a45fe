"""A private asyncio loop in a daemon thread, for samplers whose work is async but must serve sync callers too.

HTTP clients and engines bind to the loop they were first used on; running the sync entry points on
one private loop gives them one pooled client, instead of a fresh loop (and fresh connections) per
call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """Runs coroutines on a loop of its own; started on first use, stopped by `close`."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The private loop (started if it is not running yet)."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=run, name=self._name, daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    @property
    def started_loop(self) -> asyncio.AbstractEventLoop | None:
        """The private loop if it was started, else None (never starts it)."""
        return self._loop

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule `coroutine` on the private loop; a future for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the private loop and wait for it (never call from that loop itself)."""
        return self.submit(coroutine).result()

    def is_current(self) -> bool:
        """Whether the caller runs on the private loop."""
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def close(self, final: Coroutine[Any, Any, Any] | None = None, timeout: float = 10.0) -> None:
        """Run `final` (e.g. closing clients) on the loop, then stop the loop and its thread."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None:
            if final is not None:
                final.close()
            return
        if final is not None:
            try:
                asyncio.run_coroutine_threadsafe(final, loop).result(timeout)
            except (concurrent.futures.TimeoutError, RuntimeError):
                pass
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout)
        if not loop.is_running():
            loop.close()
