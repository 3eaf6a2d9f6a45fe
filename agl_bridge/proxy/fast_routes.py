"""Our token-level routes served by a bare FastAPI app, ahead of LiteLLM's middleware stack.

`/v1/completions` and the LoRA routes need nothing LiteLLM's proxy app adds (its middlewares,
logging, routing): the gateway in front has already checked the key and the rollout ids. Sending
them straight to a bare app saves every call that stack's cost, which a remote sampler in front of
this server pays once per sampled call. Every other path (and lifespan) goes to LiteLLM's app.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from starlette.routing import BaseRoute

if TYPE_CHECKING:
    from fastapi.telemetry import TelemetryConfig

NO_NATIVE_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
"""FastAPI's `telemetry=` settings for every app the proxy serves: the proxy records its own spans,
and FastAPI's per-request spans would loop into `/v1/traces` once an agent in the same process
installs a TracerProvider."""

ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]
]


class FastRoutes:
    """Dispatches HTTP requests for `routes`' paths to a bare app holding them, the rest to `app`."""

    def __init__(self, app: ASGIApp, routes: Iterable[BaseRoute]) -> None:
        self.app = app
        self.fast = FastAPI(openapi_url=None, docs_url=None, redoc_url=None, telemetry=NO_NATIVE_TELEMETRY)
        self.paths: set[str] = set()
        for route in routes:
            self.fast.router.routes.append(route)
            self.paths.add(getattr(route, "path", ""))

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] == "http" and scope["path"] in self.paths:
            await self.fast(scope, receive, send)
        else:
            await self.app(scope, receive, send)
