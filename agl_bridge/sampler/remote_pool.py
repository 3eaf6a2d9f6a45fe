"""The servers behind a remote sampler: which to try for a request, and which are out of rotation.

Requests with an affinity key (a rollout id) go to the healthy server with the highest rendezvous
hash of (key, server): every request of a rollout lands on the same server while it is healthy, and
when a server leaves or returns only the rollouts that hash to it move. Requests without a key go
to the healthy server with the fewest requests in flight. A server that fails is out of rotation
for `cooldown_s`; it is still tried last, after every healthy one, so that a request fails only when
no server at all can serve it.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class ServerState:
    """One server: its base URL (no `/v1`), health, the adapters it has loaded and its context window.

    max_model_len: the server's context window as its `/v1/models` says (vLLM's `max_model_len`);
    None until asked, 0 when the server does not say.
    """

    url: str
    down_until: float = 0.0
    last_error: str | None = None
    in_flight: int = 0
    loaded: set[str] = field(default_factory=set)
    max_model_len: int | None = None

    def is_down(self, now: float) -> bool:
        """Whether the server is out of rotation at `now` (monotonic seconds)."""
        return now < self.down_until


def normalize_url(url: str) -> str:
    """`http(s)://host:port[/prefix]` without a trailing `/` or `/v1`; ValueError naming a bad URL."""
    text = url.strip().rstrip("/")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"sampler URL {url!r} is not an http(s) URL like http://127.0.0.1:8000 (or .../v1)")
    return text[: -len("/v1")] if text.endswith("/v1") else text


class ServerPool:
    """Routing and health of a fixed list of servers; safe to use from any thread."""

    def __init__(self, urls: Sequence[str], *, cooldown_s: float = 10.0) -> None:
        servers = [ServerState(normalize_url(url)) for url in urls]
        if not servers:
            raise ValueError("a remote sampler needs at least one server URL")
        seen = [s.url for s in servers]
        if len(set(seen)) != len(seen):
            raise ValueError(f"sampler URLs must differ; got {seen}")
        self.servers = servers
        self.cooldown_s = cooldown_s
        self._lock = threading.Lock()
        self._tiebreak = itertools.count()

    def order(self, key: str | None) -> list[ServerState]:
        """Servers to try for a request, best first: healthy ones, then the rest by soonest recovery."""
        now = time.monotonic()
        with self._lock:
            healthy = [s for s in self.servers if not s.is_down(now)]
            down = sorted((s for s in self.servers if s.is_down(now)), key=lambda s: s.down_until)
            if key is not None:
                healthy.sort(key=lambda s: _score(key, s.url), reverse=True)
            elif len(healthy) > 1:
                # Round-robin among the least busy, so that sequential calls spread out too.
                start = next(self._tiebreak) % len(healthy)
                rotated = healthy[start:] + healthy[:start]
                healthy = sorted(rotated, key=lambda s: s.in_flight)
        return healthy + down

    def mark_down(self, server: ServerState, reason: str) -> None:
        """Take `server` out of rotation for the cooldown, remembering why."""
        with self._lock:
            server.down_until = time.monotonic() + self.cooldown_s
            server.last_error = reason

    def mark_up(self, server: ServerState) -> None:
        """Put `server` back into rotation (it just served a request)."""
        if server.down_until:
            with self._lock:
                server.down_until = 0.0

    def started(self, server: ServerState) -> None:
        """Count a request in flight on `server`."""
        with self._lock:
            server.in_flight += 1

    def finished(self, server: ServerState) -> None:
        """Count a request on `server` as done."""
        with self._lock:
            server.in_flight -= 1

    def status(self) -> list[dict[str, object]]:
        """Each server's URL, whether it is in rotation, its last error and requests in flight."""
        now = time.monotonic()
        with self._lock:
            return [
                {"url": s.url, "healthy": not s.is_down(now), "last_error": s.last_error, "in_flight": s.in_flight}
                for s in self.servers
            ]


def _score(key: str, url: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}\0{url}".encode(), digest_size=8).digest(), "big")
