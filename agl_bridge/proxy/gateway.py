"""The proxy's one front door: every request passes this ASGI app first, and only this one of ours.

In order, for an HTTP request:
1. Rollout routing. An unmodified agent only changes its `base_url` to
   `.../rollout/{rollout_id}/attempt/{attempt_id}/v1`; such paths are rewritten to `/v1/...` and the
   ids passed on as `x-rollout-id` / `x-attempt-id` headers (replacing any the client sent), which
   is how everything behind learns the rollout.
2. The key. Every route but the liveness probes needs it (`Authorization: Bearer`, `x-api-key` or
   `api-key`), websocket routes included; a missing or wrong key is a 401 (a websocket is closed,
   which its client sees as a 403). This is the only key check: LiteLLM's own is replaced by
   `litellm_hooks.admitted_by_gateway`, which accepts exactly the requests this door let in.
3. The ids (a 400 naming the header before any work is done), and the body: a JSON body that is
   not an object is never valid, and LiteLLM would crash on it with a plain-text 500 (a 400 here).
4. The rollout becomes the sampler's affinity key while the request is served
   (`agl_bridge.sampler.affinity`), so a remote sampler keeps a rollout on one server.
5. Dispatch: our token routes (token-id `/v1/completions`, the LoRA routes) go to a bare app —
   none of LiteLLM's middleware, logging or auth; everything else (and lifespan) goes to LiteLLM's
   proxy app, whose self-written error bodies get a word `code` on the way out.
Every refusal is shaped by `agl_bridge.proxy.errors`.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from fastapi import FastAPI
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agl_bridge import semconv
from agl_bridge.proxy.errors import (
    AUTHENTICATION,
    ApiError,
    install_error_handlers,
    protocol_of,
    send_error,
    with_word_codes,
)
from agl_bridge.sampler.affinity import sampling_affinity

if TYPE_CHECKING:
    from fastapi.telemetry import TelemetryConfig

ROLLOUT_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$")
_ROLLOUT_PATH = re.compile(r"^/rollout/(?P<rollout>[^/]*)/attempt/(?P<attempt>[^/]*)(?P<rest>/.*)?$")
OPEN_PATHS = frozenset({"/health/liveliness", "/health/liveness", "/health/readiness"})
"""The only paths answered without the key: liveness/readiness probes that say only that the server is up."""

NO_NATIVE_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
"""FastAPI's `telemetry=` settings for every app the proxy serves: the proxy records its own spans,
and FastAPI's per-request spans would loop into `/v1/traces` once an agent in the same process
installs a TracerProvider."""

_ROLLOUT_HEADER = semconv.HEADER_ROLLOUT_ID.encode()
_ATTEMPT_HEADER = semconv.HEADER_ATTEMPT_ID.encode()
_ADMITTED = "agl.admitted"
_NOT_JSON = (
    b"application/x-protobuf",
    b"application/protobuf",
    b"multipart/",
    b"application/x-www-form-urlencoded",
    b"application/octet-stream",
)


def admitted(scope: Scope) -> bool:
    """Whether the gateway let this request in (its key was checked); read from the request's state."""
    return bool((scope.get("state") or {}).get(_ADMITTED))


class Gateway:
    """The front door: rollout routing, the key, id and body checks, affinity, and dispatch.

    `app` is LiteLLM's proxy app; `routes` are ours, served from a bare app on their paths (any
    method: a wrong one gets that app's 405).
    """

    def __init__(self, app: ASGIApp, *, api_key: str, routes: Iterable[BaseRoute] = ()) -> None:
        if not api_key:
            raise ValueError("the gateway needs a non-empty API key")
        self.app = app
        self._key = api_key.encode()
        self.own = FastAPI(openapi_url=None, docs_url=None, redoc_url=None, telemetry=NO_NATIVE_TELEMETRY)
        self.own.router.routes.extend(routes)
        self._own_paths = frozenset(getattr(route, "path", "") for route in self.own.router.routes)
        install_error_handlers(self.own)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":
            if not self._authorized(scope.get("headers", ())):
                # LiteLLM serves websocket routes (/v1/realtime) too: the key guards them alike. A close
                # before the handshake is accepted is answered with HTTP 403.
                await send({"type": "websocket.close", "code": 1008, "reason": "missing or wrong API key"})
                return
            scope.setdefault("state", {})[_ADMITTED] = True
            await self.app(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        path: str = scope["path"]
        match = _ROLLOUT_PATH.match(path)
        if match:
            path = match["rest"] or "/"
            headers = [(k, v) for k, v in headers if k not in (_ROLLOUT_HEADER, _ATTEMPT_HEADER)]
            headers += [(_ROLLOUT_HEADER, match["rollout"].encode()), (_ATTEMPT_HEADER, match["attempt"].encode())]
            scope = {**scope, "path": path, "raw_path": path.encode(), "headers": headers}
        if path not in OPEN_PATHS and not self._authorized(headers):
            message = (
                "missing or wrong API key: send the key printed by `agl-bridge serve` as "
                "'Authorization: Bearer <key>' (the OpenAI client's api_key)"
            )
            await send_error(send, ApiError(401, message, AUTHENTICATION, code="invalid_api_key"), protocol_of(path))
            return
        rollout, problem = _rollout_of(headers)
        if problem is not None:
            await send_error(send, problem, protocol_of(path))
            return
        if _json_or_untyped(headers):
            # LiteLLM answers a JSON body that is not an object (a list, a string, null) with a
            # plain-text 500 from its auth layer, on GET routes too; such a body is never valid.
            receive, first = await _peek_first_byte(receive)
            if first is not None and first != b"{":
                message = 'the request body must be a JSON object (e.g. {"model": ..., "messages": [...]})'
                error = ApiError(400, message, param="request_body", code="invalid_value")
                await send_error(send, error, protocol_of(path))
                return
        scope.setdefault("state", {})[_ADMITTED] = True
        app: ASGIApp = self.own
        send_on = send
        if path not in self._own_paths:
            app, send_on = self.app, with_word_codes(send)
        if rollout is None:
            await app(scope, receive, send_on)
            return
        with sampling_affinity(rollout):
            await app(scope, receive, send_on)

    def _authorized(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        for name, value in headers:
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                candidate = value[7:].strip()
            elif name in (b"x-api-key", b"api-key"):
                candidate = value.strip()
            else:
                continue
            if hmac.compare_digest(candidate, self._key):
                return True
        return False


def _rollout_of(headers: list[tuple[bytes, bytes]]) -> tuple[str | None, ApiError | None]:
    """The request's rollout id (None outside rollouts), or the 400 for malformed routing headers."""
    rollout: str | None = None
    attempt: str | None = None
    for name, value in headers:
        if name == _ROLLOUT_HEADER:
            rollout = value.decode("latin-1")
        elif name == _ATTEMPT_HEADER:
            attempt = value.decode("latin-1")
    for header, given in ((semconv.HEADER_ROLLOUT_ID, rollout), (semconv.HEADER_ATTEMPT_ID, attempt)):
        if given is not None and not ROLLOUT_ID_PATTERN.match(given):
            message = (
                f"malformed {header.removeprefix('x-').replace('-', ' ')} {given!r}: use 1-128 characters from "
                "letters, digits and . _ : - (starting with a letter or digit), e.g. /rollout/ro-1/attempt/at-1/v1 "
                "as the base URL"
            )
            return None, ApiError(400, message, param=header, code="invalid_rollout_id")
    if attempt is not None and rollout is None:
        message = "an attempt id was given without a rollout id; send both or neither"
        return None, ApiError(400, message, param=semconv.HEADER_ATTEMPT_ID, code="invalid_rollout_id")
    return rollout, None


def _json_or_untyped(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether LiteLLM would parse the body as JSON: anything but protobuf (OTLP), form uploads and raw bytes.

    LiteLLM reads a body as JSON whatever its declared type (text/plain included).
    """
    for name, value in headers:
        if name == b"content-type":
            return not value.lower().lstrip().startswith(_NOT_JSON)
    return True


async def _peek_first_byte(receive: Receive) -> tuple[Receive, bytes | None]:
    """Read the body up to its first non-blank byte; a `receive` that replays what was read, and that byte."""
    buffered: list[Message] = []
    first = None
    while True:
        message = await receive()
        buffered.append(message)
        if message["type"] != "http.request":
            break
        stripped = message.get("body", b"").lstrip(b" \t\r\n")
        if stripped:
            first = stripped[:1]
            break
        if not message.get("more_body", False):
            break

    async def replay() -> Message:
        if buffered:
            return buffered.pop(0)
        return await receive()

    return replay, first
