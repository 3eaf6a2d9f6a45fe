"""The ASGI layer in front of the LiteLLM proxy: rollout routing by URL path, and the key check.

An unmodified agent only changes its `base_url` to `.../rollout/{rollout_id}/attempt/{attempt_id}/v1`;
this layer rewrites such paths to `/v1/...` and passes the ids on as `x-rollout-id` /
`x-attempt-id` headers (replacing any the client sent), which is how everything behind it learns
the rollout. Ids are checked here, so a malformed one is a 400 before any work is done.

Every route but the liveness probe needs the key, websocket routes included (`Authorization: Bearer`, `x-api-key` or
`api-key`); a missing or wrong key is an OpenAI-style 401. LiteLLM's own check would answer 500
without its database, so the check lives here, for all routes alike. A JSON body that is not an
object is refused here too (400), as LiteLLM would crash on it with a plain-text 500.
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from agl_bridge import semconv
from agl_bridge.proxy.errors import AUTHENTICATION, error_body

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]

ROLLOUT_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$")
_ROLLOUT_PATH = re.compile(r"^/rollout/(?P<rollout>[^/]*)/attempt/(?P<attempt>[^/]*)(?P<rest>/.*)?$")
OPEN_PATHS = frozenset({"/health/liveliness", "/health/liveness", "/health/readiness"})


class Gateway:
    """Wraps an ASGI app with rollout path routing, id validation and the API-key check."""

    def __init__(self, app: ASGIApp, *, api_key: str) -> None:
        if not api_key:
            raise ValueError("the gateway needs a non-empty API key")
        self.app = app
        self._key = api_key.encode()

    async def __call__(
        self, scope: Scope, receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
    ) -> None:
        if scope["type"] == "websocket" and not self._authorized(list(scope.get("headers", []))):
            # LiteLLM serves websocket routes (/v1/realtime) too: the key guards them alike. A close
            # before the handshake is accepted is answered with HTTP 403.
            await send({"type": "websocket.close", "code": 1008, "reason": "missing or wrong API key"})
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = [(k, v) for k, v in scope.get("headers", [])]
        path = scope["path"]
        match = _ROLLOUT_PATH.match(path)
        if match:
            rollout, attempt, rest = match["rollout"], match["attempt"], match["rest"] or "/"
            headers = [
                (k, v)
                for k, v in headers
                if k not in (semconv.HEADER_ROLLOUT_ID.encode(), semconv.HEADER_ATTEMPT_ID.encode())
            ]
            headers += [
                (semconv.HEADER_ROLLOUT_ID.encode(), rollout.encode()),
                (semconv.HEADER_ATTEMPT_ID.encode(), attempt.encode()),
            ]
            scope = {**scope, "path": rest, "raw_path": rest.encode(), "headers": headers}
            path = rest
        if path not in OPEN_PATHS and not self._authorized(headers):
            await _send_json(
                send,
                401,
                error_body(
                    "missing or wrong API key: send the key printed by `agl-bridge serve` as "
                    "'Authorization: Bearer <key>' (the OpenAI client's api_key)",
                    type_=AUTHENTICATION,
                    code="invalid_api_key",
                ),
            )
            return
        problem = _id_problem(headers)
        if problem is not None:
            await _send_json(send, 400, error_body(problem[1], param=problem[0], code="invalid_rollout_id"))
            return
        if _json_or_untyped(headers):
            # LiteLLM answers a JSON body that is not an object (a list, a string, null) with a
            # plain-text 500 from its auth layer, on GET routes too; such a body is never valid.
            receive, first = await _peek_first_byte(receive)
            if first is not None and first != b"{":
                await _send_json(
                    send,
                    400,
                    error_body(
                        'the request body must be a JSON object (e.g. {"model": ..., "messages": [...]})',
                        param="request_body",
                        code="invalid_value",
                    ),
                )
                return
        await self.app(scope, receive, send)

    def _authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
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


def _id_problem(headers: list[tuple[bytes, bytes]]) -> tuple[str, str] | None:
    values = {k: v for k, v in headers if k in (semconv.HEADER_ROLLOUT_ID.encode(), semconv.HEADER_ATTEMPT_ID.encode())}
    rollout = values.get(semconv.HEADER_ROLLOUT_ID.encode())
    attempt = values.get(semconv.HEADER_ATTEMPT_ID.encode())
    for name, value in ((semconv.HEADER_ROLLOUT_ID, rollout), (semconv.HEADER_ATTEMPT_ID, attempt)):
        if value is not None and not ROLLOUT_ID_PATTERN.match(value.decode("latin-1")):
            return name, (
                f"malformed {name.removeprefix('x-').replace('-', ' ')} {value.decode('latin-1')!r}: use 1-128 "
                "characters from letters, digits and . _ : - (starting with a letter or digit), e.g. "
                "/rollout/ro-1/attempt/at-1/v1 as the base URL"
            )
    if attempt is not None and rollout is None:
        return semconv.HEADER_ATTEMPT_ID, "an attempt id was given without a rollout id; send both or neither"
    return None


_NOT_JSON = (
    b"application/x-protobuf",
    b"application/protobuf",
    b"multipart/",
    b"application/x-www-form-urlencoded",
    b"application/octet-stream",
)


def _json_or_untyped(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether LiteLLM would parse the body as JSON: anything but protobuf (OTLP), form uploads and raw bytes.

    LiteLLM reads a body as JSON whatever its declared type (text/plain included).
    """
    for name, value in headers:
        if name == b"content-type":
            return not value.lower().lstrip().startswith(_NOT_JSON)
    return True


async def _peek_first_byte(
    receive: Callable[[], Awaitable[Any]],
) -> tuple[Callable[[], Awaitable[Any]], bytes | None]:
    """Read the body up to its first non-blank byte; a `receive` that replays what was read, and that byte."""
    buffered: list[Any] = []
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

    async def replay() -> Any:
        if buffered:
            return buffered.pop(0)
        return await receive()

    return replay, first


async def _send_json(send: Callable[[Any], Awaitable[None]], status: int, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": payload})
