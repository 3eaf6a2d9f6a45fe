"""ASGI middleware that makes a request's rollout the sampler's affinity key while it is served.

It sits behind the gateway (which has put the rollout id from the URL path into `x-rollout-id` and
validated it), so every sampling call made while serving the request — chat, streaming or
`/v1/completions` — sees `agl_bridge.sampler.affinity.current_affinity()` return the rollout id, and a
remote sampler keeps that rollout on one server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from agl_bridge import semconv
from agl_bridge.sampler.affinity import sampling_affinity

_HEADER = semconv.HEADER_ROLLOUT_ID.encode()


class AffinityMiddleware:
    """Wraps an ASGI app; HTTP requests with an `x-rollout-id` run with it as the affinity key."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] == "http":
            for name, value in scope.get("headers", ()):
                if name == _HEADER:
                    with sampling_affinity(value.decode("latin-1")):
                        await self.app(scope, receive, send)
                    return
        await self.app(scope, receive, send)
