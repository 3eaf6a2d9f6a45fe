"""The Tinker API's futures: an asynchronous call answers with a request id at once, and the SDK
long-polls `retrieve_future` for its result.

A result is JSON (most calls) or protobuf bytes (forward/backward and sample results); a failure carries
the SDK's category: "user" for a request we refuse (the message says what to change), "server" for
our own fault. The SDK re-polls at once on "try again", so a poll is held open until the result is
ready or `poll_s` passes.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Literal

Category = Literal["user", "server", "unknown"]


@dataclass
class Outcome:
    """A finished call: exactly one of `json`, `proto` (bytes) or `error` (with its category)."""

    json: dict[str, Any] | None = None
    proto: bytes | None = None
    error: str | None = None
    category: Category = "unknown"


@dataclass
class _Entry:
    done: asyncio.Event = field(default_factory=asyncio.Event)
    outcome: Outcome | None = None
    finished_at: float | None = None


class FutureTable:
    """Request ids → outcomes, on the server's event loop. Outcomes are kept `keep_s` after they finish
    (a poll whose answer was lost on the way is answered again), then dropped."""

    def __init__(self, *, poll_s: float = 25.0, keep_s: float = 3600.0) -> None:
        self.poll_s = poll_s
        self._keep_s = keep_s
        self._entries: dict[str, _Entry] = {}
        self._ids = itertools.count(1)
        self._next_expiry = time.monotonic() + keep_s

    def create(self, kind: str) -> str:
        """A new pending request id (`kind` names the call, for logs and for the reader)."""
        self._expire()
        request_id = f"{kind}-{next(self._ids)}"
        self._entries[request_id] = _Entry()
        return request_id

    def finish(self, request_id: str, outcome: Outcome) -> None:
        """Record a request's outcome and wake its pollers."""
        entry = self._entries.get(request_id)
        if entry is None or entry.outcome is not None:
            return
        entry.outcome = outcome
        entry.finished_at = time.monotonic()
        entry.done.set()

    def known(self, request_id: str) -> bool:
        """Whether `request_id` is pending or finished (and not yet dropped)."""
        return request_id in self._entries

    async def wait(self, request_id: str) -> Outcome | None:
        """The outcome, waiting up to `poll_s`; None when it is still running (the SDK polls again)."""
        entry = self._entries[request_id]
        if entry.outcome is None:
            try:
                await asyncio.wait_for(entry.done.wait(), self.poll_s)
            except TimeoutError:
                return None
        return entry.outcome

    def _expire(self) -> None:
        # A sweep walks every entry: once per `keep_s`, not on every new request.
        now = time.monotonic()
        if now < self._next_expiry:
            return
        self._next_expiry = now + self._keep_s
        stale = [
            key
            for key, entry in self._entries.items()
            if entry.finished_at is not None and now - entry.finished_at > self._keep_s
        ]
        for key in stale:
            del self._entries[key]
