"""The proxy's one front door: every request passes this ASGI app first, and only this one of ours.

In order, for an HTTP request:
1. Rollout routing. An unmodified agent only changes its `base_url` to
   `.../rollout/{rollout_id}/attempt/{attempt_id}/v1`; such paths are rewritten to `/v1/...` and the
   ids passed on as `x-rollout-id` / `x-attempt-id` headers (replacing any the client sent), which
   is how everything behind learns the rollout.
2. The key. Every route but the liveness probes needs one (`Authorization: Bearer`, `x-api-key` or
   `api-key`), websocket routes included; a missing, wrong, tampered or expired key is a 401 (a
   websocket is closed, which its client sees as a 403). The operator key reaches every route of
   ours and LiteLLM's inference routes; an agent key (`agl_bridge.agent_keys`) only the model
   routes of its own rollout attempt (`access_rules`): another attempt's prefix or routing headers
   are a 403, any other route a 404, and a request without routing is routed to its attempt.
   LiteLLM's management, debug, SSO, spend and upstream-health routes are a 404 for every key
   unless `management_routes` opens them to the operator. This is the only key check: LiteLLM's
   own is replaced by `litellm_hooks.admitted_by_gateway`, which accepts exactly the requests this
   door let in.
3. The ids (a 400 naming the header before any work is done), and the body: one larger than
   `max_body_bytes` is a 413 (refused by its declared length before it is read, or as soon as it
   grows past the limit), and a JSON body that is not an object is never valid (LiteLLM would crash
   on it with a plain-text 500; a 400 here). The body is read whole here and replayed to the app,
   which is cancelled if its client leaves before the answer is complete (`disconnect`).
4. The rollout becomes the sampler's affinity key while the request is served
   (`agl_bridge.sampler.affinity`), so a remote sampler keeps a rollout on one server.
5. Dispatch: a chat completion for a served model goes to `chat_route.ChatRoute` (the hot RL path,
   no LiteLLM), its Responses and Anthropic Messages requests to `bridge_route.BridgeRoute` (LiteLLM's
   translations called in-process, then the same chat service); our token routes (token-id
   `/v1/completions`, the LoRA routes, stored Responses) go to a bare app — none of LiteLLM's
   middleware, logging or auth; an embeddings request for a served model is a 501 (it only samples);
   everything else (other models, LiteLLM's routes, lifespan) goes to LiteLLM's proxy app, whose
   self-written error bodies get a word `code` on the way out.
Every refusal is shaped by `agl_bridge.proxy.errors`; with the access log on, every request but the
probes gets its line (`access_log`), with the scope of the key it came with (never the key).
"""

from __future__ import annotations

import hmac
import json
import logging
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from agl_bridge import semconv
from agl_bridge.agent_keys import AGENT_KEY_PREFIX, AgentKeys, AgentScope, KeyRefusal
from agl_bridge.proxy.access_log import ACCESS_LOGGER, logged
from agl_bridge.proxy.access_rules import agent_may_call, litellm_inference
from agl_bridge.proxy.bridge_checks import check_bridged
from agl_bridge.proxy.bridge_route import BRIDGED_PATHS, BridgeRoute
from agl_bridge.proxy.chat_route import CHAT_PATHS, ChatRoute
from agl_bridge.proxy.disconnect import cancelled_on_disconnect
from agl_bridge.proxy.errors import (
    AUTHENTICATION,
    PERMISSION,
    ApiError,
    api_error,
    doubled_v1_hint,
    install_error_handlers,
    protocol_of,
    send_error,
    with_word_codes,
)
from agl_bridge.proxy.request import ROUTE_HEADERS, RequestError, route_of_headers
from agl_bridge.sampler.affinity import sampling_affinity

if TYPE_CHECKING:
    from fastapi.telemetry import TelemetryConfig

    from agl_bridge.proxy.service import ChatService

ROLLOUT_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$")
_ROLLOUT_PATH = re.compile(r"^/rollout/(?P<rollout>[^/]*)/attempt/(?P<attempt>[^/]*)(?P<rest>/.*)?$")
EMBEDDINGS_PATHS = frozenset({"/v1/embeddings", "/embeddings"})
"""Embeddings: refused for a served model, which only samples (`_no_embeddings`)."""
OPEN_PATHS = frozenset({"/health/liveliness", "/health/liveness", "/health/readiness"})
"""The only paths answered without the key: liveness/readiness probes that say only that the server is up."""

NO_NATIVE_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
"""FastAPI's `telemetry=` settings for every app the proxy serves: the proxy records its own spans,
and FastAPI's per-request spans would loop into `/v1/traces` once an agent in the same process
installs a TracerProvider."""

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
"""The body limit when none is given (the server derives its own from the model: `server.max_request_bytes`)."""

_ROLLOUT_HEADER = semconv.HEADER_ROLLOUT_ID.encode()
_ATTEMPT_HEADER = semconv.HEADER_ATTEMPT_ID.encode()
_ROUTE_HEADERS = frozenset(h.encode() for h in ROUTE_HEADERS)
_AGENT_PREFIX = AGENT_KEY_PREFIX.encode()
_QUERY_KEY = re.compile(rb"(?:^|&)(?:api[-_]?key|key|token|access_token)=", re.IGNORECASE)
_NOT_BLANK = re.compile(rb"[^ \t\r\n]")
_ADMITTED = "agl.admitted"
_NOT_PARSED = object()
_NOT_JSON = (
    b"application/x-protobuf",
    b"application/protobuf",
    b"multipart/",
    b"application/x-www-form-urlencoded",
    b"application/octet-stream",
)


OPERATOR = "operator"
"""The principal of a request that came with the operator key."""

Principal = str | AgentScope | KeyRefusal | None
"""Who sent a request: `OPERATOR`, an agent's scope, why its agent key was refused, or None (no or a wrong key)."""


def admitted(scope: Scope) -> bool:
    """Whether the gateway let this request in (its key was checked); read from the request's state."""
    return bool((scope.get("state") or {}).get(_ADMITTED))


def agent_scope_of(scope: Scope) -> AgentScope | None:
    """The scope of the agent key a request came with (None: the operator's, or not through the gateway)."""
    found = (scope.get("state") or {}).get(semconv.STATE_AGENT_SCOPE)
    return found if isinstance(found, AgentScope) else None


def describe(who: Principal) -> str:
    """A principal as the access log shows it: `operator`, `agent:ROLLOUT/ATTEMPT`, `refused` or `none`."""
    if who is None:
        return "none"
    if isinstance(who, AgentScope):
        return who.describe()
    return "refused" if isinstance(who, KeyRefusal) else who


class Gateway:
    """The front door: rollout routing, the key, id and body checks, affinity, and dispatch.

    `app` is LiteLLM's proxy app; `routes` are ours, served from a bare app on their paths (any
    method: a wrong one gets that app's 405); `chat` answers chat completions for served models, and
    `bridges` their Responses and Anthropic Messages requests (by default a `BridgeRoute`).
    Agent keys are those `AgentKeys(api_key)` mints; `management_routes` opens LiteLLM's other routes
    (management, debug, SSO, spend, upstream health) to the operator key.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_key: str,
        routes: Iterable[BaseRoute] = (),
        chat: ChatRoute | None = None,
        bridges: BridgeRoute | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        management_routes: bool = False,
    ) -> None:
        if not api_key:
            raise ValueError("the gateway needs a non-empty API key")
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be positive, got {max_body_bytes}")
        self.app = app
        self.chat = chat
        self.bridges = bridges or BridgeRoute()
        self.max_body_bytes = max_body_bytes
        self._key = api_key.encode()
        self._agents = AgentKeys(api_key)
        self.management_routes = management_routes
        self.own = FastAPI(openapi_url=None, docs_url=None, redoc_url=None, telemetry=NO_NATIVE_TELEMETRY)
        self.own.router.routes.extend(routes)
        own_paths = [str(getattr(route, "path", "")) for route in self.own.router.routes]
        self._own_paths = frozenset(p for p in own_paths if "{" not in p)
        self._own_prefixes = tuple(sorted({p[: p.index("{")] for p in own_paths if "{" in p}))
        install_error_handlers(self.own)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if scope["path"] in OPEN_PATHS:
                await self._http(scope, receive, send, None)
                return
            who = self.principal(scope.get("headers", ()))
            if not ACCESS_LOGGER.isEnabledFor(logging.INFO):
                await self._http(scope, receive, send, who)
            else:

                async def serve(scope: Scope, receive: Receive, send: Send) -> None:
                    await self._http(scope, receive, send, who)

                await logged(serve, scope, receive, send, _logged_route(scope), describe(who))
        elif kind == "websocket":
            if self.principal(scope.get("headers", ())) != OPERATOR:
                # LiteLLM serves websocket routes (/v1/realtime) too: the key guards them alike, and no
                # agent key opens one (an agent's model routes are HTTP). A close before the handshake
                # is accepted is answered with HTTP 403.
                await send({"type": "websocket.close", "code": 1008, "reason": "missing or wrong API key"})
                return
            scope.setdefault("state", {})[_ADMITTED] = True
            await self.app(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send, who: Principal) -> None:
        headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        path: str = scope["path"]
        match = _ROLLOUT_PATH.match(path)
        if match:
            path = match["rest"] or "/"
            headers = [(k, v) for k, v in headers if k not in (_ROLLOUT_HEADER, _ATTEMPT_HEADER)]
            headers += [(_ROLLOUT_HEADER, match["rollout"].encode()), (_ATTEMPT_HEADER, match["attempt"].encode())]
            scope = {**scope, "path": path, "raw_path": path.encode(), "headers": headers}
        if path not in OPEN_PATHS:
            if who is None or isinstance(who, KeyRefusal):
                await send_error(send, _unauthenticated(who, scope.get("query_string", b"")), protocol_of(path))
                return
            if isinstance(who, AgentScope):
                headers, refusal = _scoped(who, scope["method"], path, headers)
                if refusal is not None:
                    await send_error(send, refusal, protocol_of(path))
                    return
                state = {**(scope.get("state") or {}), semconv.STATE_AGENT_SCOPE: who}
                scope = {**scope, "headers": headers, "state": state}
            elif not self._reachable(path):
                await send_error(send, _closed(scope["method"], path), protocol_of(path))
                return
        rollout, problem = _rollout_of(headers)
        if problem is not None:
            await send_error(send, problem, protocol_of(path))
            return
        protocol = protocol_of(path)
        declared = _content_length(headers)
        if declared is not None and declared > self.max_body_bytes:
            await send_error(send, self._too_large(declared), protocol)
            return
        try:
            body = await _read_body(receive, self.max_body_bytes)
        except _ClientLeft:
            return  # nobody to answer
        if body is None:
            await send_error(send, self._too_large(None), protocol)
            return
        if _json_or_untyped(headers):
            # LiteLLM answers a JSON body that is not an object (a list, a string, null) with a
            # plain-text 500 from its auth layer, on GET routes too; such a body is never valid.
            first = _NOT_BLANK.search(body)
            if first is not None and body[first.start()] != ord("{"):
                message = 'the request body must be a JSON object (e.g. {"model": ..., "messages": [...]})'
                error = ApiError(400, message, param="request_body", code="invalid_value")
                await send_error(send, error, protocol)
                return
        scope.setdefault("state", {})[_ADMITTED] = True
        document: Any = _NOT_PARSED
        if scope["method"] == "POST" and (path in CHAT_PATHS or path in BRIDGED_PATHS or path in EMBEDDINGS_PATHS):
            try:
                document = json.loads(body)
            except ValueError:
                pass  # LiteLLM answers a body that is not JSON in shape
        if path in BRIDGED_PATHS and document is not _NOT_PARSED:
            problem = _malformed_bridged(path, document)  # LiteLLM's translations crash on a malformed body
            if problem is not None:
                await send_error(send, problem, protocol)
                return
        served = self._served(document)

        async def dispatch(receive: Receive, send: Send) -> None:
            if served is not None and path in EMBEDDINGS_PATHS:
                await send_error(send, _no_embeddings(path, served[1]["model"]))
            elif served is not None:
                service, parsed = served
                route = route_of_headers({k.decode(): v.decode("latin-1") for k, v in headers if k in _ROUTE_HEADERS})
                assert self.chat is not None
                answer: ChatRoute | BridgeRoute = self.chat if path in CHAT_PATHS else self.bridges
                await answer(scope, receive, send, service=service, body=parsed, route=route)
            elif path in self._own_paths or path.startswith(self._own_prefixes):
                await self.own(scope, receive, send)
            else:
                await self.app(scope, receive, with_word_codes(send))

        with sampling_affinity(rollout):
            await cancelled_on_disconnect(dispatch, {"type": "http.request", "body": body}, receive, send)

    def _served(self, document: Any) -> tuple[ChatService, dict[str, Any]] | None:
        """The service and body of a chat completion, Responses or Messages request (`document`, its parsed
        body) for a served model; None for other requests: not one of those, or asking for another model."""
        if self.chat is None or not isinstance(document, dict):
            return None
        service = self.chat.service_for(document)
        return None if service is None else (service, document)

    def _too_large(self, size: int | None) -> ApiError:
        told = f"is {size} bytes" if size is not None else "is longer than that"
        message = (
            f"the request body {told}; this server accepts at most {self.max_body_bytes} bytes (agl-bridge serve "
            "--max-request-mb), more than any prompt that fits the model's context window needs: shorten the "
            "messages (e.g. truncate long tool outputs)"
        )
        return ApiError(413, message, param="request_body", code="request_too_large")

    def principal(self, headers: Iterable[tuple[bytes, bytes]]) -> Principal:
        """Who the request's key says sent it: the operator, an agent's scope, or why not (None: no or a wrong key).

        Every key header counts (`Authorization: Bearer`, `x-api-key`, `api-key`): the operator key in
        any of them makes the operator; agent keys naming two different scopes are refused.
        """
        found: Principal = None
        for name, value in headers:
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                candidate = value[7:].strip()
            elif name in (b"x-api-key", b"api-key"):
                candidate = value.strip()
            else:
                continue
            if hmac.compare_digest(candidate, self._key):
                return OPERATOR
            if not candidate.startswith(_AGENT_PREFIX):
                continue
            checked = self._agents.check(candidate)
            if isinstance(checked, AgentScope) and isinstance(found, AgentScope) and checked != found:
                return KeyRefusal("the request carries agent keys of two different attempts; send one key")
            if not isinstance(found, AgentScope):
                found = checked
        return found

    def _reachable(self, path: str) -> bool:
        """Whether the operator key reaches `path`: ours, LiteLLM's inference routes, the rest only when opened."""
        return (
            self.management_routes
            or path in self._own_paths
            or path.startswith(self._own_prefixes)
            or litellm_inference(path)
        )


def _unauthenticated(refusal: KeyRefusal | None, query: bytes) -> ApiError:
    """The 401 for a request without a usable key: what was wrong, and what to send instead."""
    if refusal is not None:
        message = refusal.reason
    elif _QUERY_KEY.search(query):
        message = (
            "keys are not accepted in the query string (URLs end up in logs and histories): send the key as "
            "'Authorization: Bearer <key>' (the OpenAI client's api_key)"
        )
    else:
        message = (
            "missing or wrong API key: send the key printed by `agl-bridge serve` (or the agent key your harness "
            "gave you) as 'Authorization: Bearer <key>' (the OpenAI client's api_key)"
        )
    return ApiError(401, message, AUTHENTICATION, code="invalid_api_key")


def _scoped(
    who: AgentScope, method: str, path: str, headers: list[tuple[bytes, bytes]]
) -> tuple[list[tuple[bytes, bytes]], ApiError | None]:
    """An agent's request routed to its own attempt (`headers` with its ids), or the refusal: 403 for another
    attempt's prefix or routing headers, 404 for a route agent keys do not reach."""
    own = {_ROLLOUT_HEADER: who.rollout_id.encode(), _ATTEMPT_HEADER: who.attempt_id.encode()}
    if any(own.get(name, value) != value for name, value in headers):
        message = (
            "this agent key is scoped to another rollout attempt: call only under the base URL it was issued with "
            "(/rollout/ROLLOUT_ID/attempt/ATTEMPT_ID/v1), without other routing headers"
        )
        return headers, ApiError(403, message, PERMISSION, param=semconv.HEADER_ROLLOUT_ID, code="forbidden")
    if not agent_may_call(method, path):
        message = (
            f"{method} {path[:200]} is not served to agent keys: an agent key reaches its own model routes only "
            "(chat completions, completions, Responses, Anthropic Messages, models); rewards, the lifecycle and "
            "weights need the operator's key"
        ) + doubled_v1_hint(path)
        return headers, ApiError(404, message, code="not_found")
    routed = [(k, v) for k, v in headers if k not in own]
    return routed + list(own.items()), None


def _closed(method: str, path: str) -> ApiError:
    """The 404 for one of LiteLLM's closed routes (management, debug, SSO, spend, upstream health)."""
    if hint := doubled_v1_hint(path):
        return ApiError(404, f"no route {method} {path[:200]}{hint}", code="not_found")
    message = (
        f"{method} {path[:200]} is not served: LiteLLM's management, debug, SSO, spend and upstream-health routes "
        "are off (agl-bridge serve --litellm-admin-routes opens them to the operator key)"
    )
    return ApiError(404, message, code="not_found")


def _no_embeddings(path: str, model: str) -> ApiError:
    """The refusal of an embeddings request for a served model (LiteLLM's route would fail with a 500)."""
    message = (
        f"POST {path} is not supported for {model!r}: agl-bridge serves its models for sampling only (chat "
        "completions, completions, Responses, Anthropic Messages); embed with another model, e.g. one listed in "
        "a --litellm-config"
    )
    return ApiError(501, message, param="model", code="unsupported")


def _malformed_bridged(path: str, parsed: Any) -> ApiError | None:
    """The refusal of a Responses / Anthropic body (parsed) that cannot be bridged (whatever its model), or None."""
    try:
        if not isinstance(parsed, dict) or not isinstance(parsed.get("model"), str):
            raise RequestError("model: the name of a served model is required", "model")
        check_bridged(path, parsed)
    except RequestError as error:
        return api_error(error)
    return None


def _logged_route(scope: Scope) -> tuple[str, str | None, str | None]:
    """(path, rollout id, attempt id) of a request as the access log shows them."""
    match = _ROLLOUT_PATH.match(scope["path"])
    if match:
        return match["rest"] or "/", match["rollout"], match["attempt"]
    ids = {k: v.decode("latin-1") for k, v in scope.get("headers", ()) if k in (_ROLLOUT_HEADER, _ATTEMPT_HEADER)}
    return scope["path"], ids.get(_ROLLOUT_HEADER), ids.get(_ATTEMPT_HEADER)


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


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The declared body length, if the request declares a valid one."""
    for name, value in headers:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


class _ClientLeft(Exception):
    """The client disconnected before its request body was complete."""


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None once it grows past `limit`; `_ClientLeft` if the client left while sending it."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise _ClientLeft
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
