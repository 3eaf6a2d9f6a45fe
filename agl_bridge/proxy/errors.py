"""Every refusal the proxy answers, shaped in this one module for the protocol the client speaks.

Whichever layer refuses — the gateway (key, rollout ids, body), the chat service (`RequestError`),
the store or a remote sampler (503), LiteLLM (its `ProxyException`s), Starlette (unknown path,
wrong method) or FastAPI (validation) — the refusal is first described protocol-neutrally as an
`ApiError` (`api_error`), then written in the wire shape of a `WireProtocol` (`error_body`).
OpenAI's routes answer `{"error": {"message", "type", "param", "code"}}`, with `param` naming the
offending field and `code` a word ("invalid_value"), never the HTTP status; Anthropic's
`/v1/messages` answers `{"type": "error", "error": {"type", "message"}}` (the field named in the
message). A prompt that does not fit the context window is worded so that every agent recognises it
and compacts its history: code `context_length_exceeded`, a message starting "prompt is too long"
(what Claude Code looks for) and containing "maximum context length" (what OpenAI's clients look for).

LiteLLM needs our refusals as its own exceptions (`to_proxy_exception` for its pre-call hooks,
`to_litellm_error` for a provider), and writes some error bodies itself, bypassing the exception
handlers (a stream whose first chunk fails becomes a JSON error with `code` set to the status as a
string): `with_word_codes` rewrites those on their way out.
"""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from litellm.proxy._types import ProxyException
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Message, Send

from agl_bridge import semconv
from agl_bridge.proxy.request import RequestError
from agl_bridge.sampler.remote_errors import RemoteSamplerError
from agl_bridge.store.errors import (
    AttemptNotFoundError,
    RolloutNotFoundError,
    StoreConflictError,
    StoreError,
    TaskConflictError,
)

logger = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
PERMISSION = "permission_error"
SERVER_ERROR = "server_error"

STATUS_CODES = {
    400: "invalid_value",
    401: "invalid_api_key",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "timeout",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_value",
    429: "rate_limit_exceeded",
    500: "internal_error",
    502: "bad_gateway",
    503: "service_unavailable",
    504: "timeout",
}
"""The word `code` of a refusal that carries none, by HTTP status."""


_LOOKUP_PARAMS = {AttemptNotFoundError: semconv.HEADER_ATTEMPT_ID, RolloutNotFoundError: semconv.HEADER_ROLLOUT_ID}

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
_CONTEXT_PREFIX = "prompt is too long for the model's maximum context length: "


class WireProtocol(enum.Enum):
    """The API a client speaks, which decides the shape of the errors it gets."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"


def protocol_of(path: str) -> WireProtocol:
    """The protocol whose error shape a request to `path` gets (the path without the rollout prefix)."""
    while path.startswith("/v1/"):  # /v1/messages; /v1/v1/messages, a client adding /v1 to a base URL with one
        path = path[3:]
    if path == "/messages" or path.startswith("/messages/"):  # /messages/count_tokens, /messages/batches
        return WireProtocol.ANTHROPIC
    return WireProtocol.OPENAI


@dataclass(frozen=True)
class ApiError:
    """A refusal, independent of the wire protocol: status, message, error type, the field, a word code."""

    status: int
    message: str
    type: str = INVALID_REQUEST
    param: str | None = None
    code: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


def api_error(exc: BaseException, *, method: str = "", path: str = "") -> ApiError:
    """What `exc`, raised while serving `method path`, tells the client."""
    if isinstance(exc, RequestError):
        message = exc.message
        if exc.code == CONTEXT_LENGTH_EXCEEDED and not message.startswith(_CONTEXT_PREFIX):
            message = _CONTEXT_PREFIX + message
        return ApiError(exc.status, message, _type_for(exc.status), exc.param, exc.code)
    if isinstance(exc, (AttemptNotFoundError, RolloutNotFoundError)):  # a lifecycle request naming nothing known
        return ApiError(404, str(exc), param=_LOOKUP_PARAMS[type(exc)], code="not_found")
    if isinstance(exc, StoreConflictError):  # a finished attempt, another task: the request cannot apply
        conflicting = "task_id" if isinstance(exc, TaskConflictError) else semconv.HEADER_ATTEMPT_ID
        return ApiError(409, str(exc), param=conflicting, code="conflict")
    if isinstance(exc, StoreError):
        # Not recorded, so not served: the caller retries once the store is writable.
        message = f"the call was not served because it could not be recorded: {exc}"
        return ApiError(503, message, SERVER_ERROR, code="store_unavailable")
    if isinstance(exc, RemoteSamplerError):  # no remote sampler server could serve the call
        return ApiError(503, str(exc), SERVER_ERROR, code="sampler_unavailable")
    if isinstance(exc, ProxyException):
        status = _status(getattr(exc, "code", None))
        param = getattr(exc, "param", None)
        return ApiError(
            status,
            str(getattr(exc, "message", exc)),
            _text(getattr(exc, "type", None)) or INVALID_REQUEST,
            None if param in (None, "None") else str(param),
            word_code(getattr(exc, "openai_code", None)) or STATUS_CODES.get(status),
            dict(getattr(exc, "headers", None) or {}),
        )
    if isinstance(exc, StarletteHTTPException):
        status = exc.status_code
        message = exc.detail if isinstance(exc.detail, str) and exc.detail else "error"
        if status == 404:
            message = f"no route {method} {path}; the API is under /v1 (or /rollout/ROLLOUT_ID/attempt/ATTEMPT_ID/v1)"
            message += doubled_v1_hint(path)
        elif status == 405:
            message = f"{method} is not allowed on {path}"
        return ApiError(status, message, _type_for(status), code=STATUS_CODES.get(status), headers=exc.headers or {})
    if isinstance(exc, RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {}
        location = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "path", "header")]
        param = ".".join(location) or None
        return ApiError(
            400, f"{param or 'the request'}: {first.get('msg', 'is invalid')}", param=param, code="invalid_value"
        )
    message = f"the server failed unexpectedly ({type(exc).__name__}); see the server log"
    return ApiError(500, message, SERVER_ERROR, code="internal_error")


def doubled_v1_hint(path: str) -> str:
    """The hint for a base URL that ends in /v1 given to a client that adds /v1 itself ("" otherwise)."""
    if path.startswith("/v1/v1/"):
        return "; the client adds /v1 itself (Anthropic's SDKs do): drop /v1 from its base URL"
    return ""


def logged(error: ApiError, exc: BaseException, scope: Mapping[str, Any]) -> ApiError:
    """`error` (what `exc` tells the client), with the traceback of a server-side failure (5xx) in the log."""
    if error.status >= 500:
        logger.error("serving %s failed", scope.get("path"), exc_info=exc)
    return error


def error_body(error: ApiError, protocol: WireProtocol = WireProtocol.OPENAI) -> dict[str, Any]:
    """The JSON body of `error` in `protocol`'s shape."""
    if protocol is WireProtocol.ANTHROPIC:
        message = error.message
        if error.param and error.code != CONTEXT_LENGTH_EXCEEDED and error.param not in message:
            message = f"{error.param}: {message}"
        return {"type": "error", "error": {"type": anthropic_error_type(error.status), "message": message}}
    return {"error": {"message": error.message, "type": error.type, "param": error.param, "code": error.code}}


_ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error_type(status: int) -> str:
    """Anthropic's error `type` for an HTTP status (its API's documented list)."""
    if status in _ANTHROPIC_TYPES:
        return _ANTHROPIC_TYPES[status]
    return "invalid_request_error" if status < 500 else "api_error"


def error_response(error: ApiError, protocol: WireProtocol = WireProtocol.OPENAI) -> JSONResponse:
    """`error` as a Starlette response."""
    return JSONResponse(error_body(error, protocol), status_code=error.status, headers=dict(error.headers) or None)


async def send_error(send: Send, error: ApiError, protocol: WireProtocol = WireProtocol.OPENAI) -> None:
    """Answer an ASGI HTTP request with `error` (for layers in front of any app)."""
    payload = json.dumps(error_body(error, protocol)).encode()
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in error.headers.items()]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


# ----------------------------------------------------------------------------------- LiteLLM's side


def to_proxy_exception(exc: BaseException) -> ProxyException:
    """The exception a LiteLLM pre-call hook raises for `exc`: its proxy answers it as `api_error(exc)`."""
    error = api_error(exc)
    return ProxyException(
        message=error.message, type=error.type, param=error.param, code=error.status, openai_code=error.code
    )


def to_litellm_error(exc: BaseException, model: str) -> Exception:
    """The LiteLLM exception a custom provider raises for `exc` (status, param and code kept)."""
    import litellm

    error = api_error(exc)
    kind = _LITELLM_ERRORS.get(error.status, "InternalServerError")
    converted = getattr(litellm, kind)(message=error.message, model=model, llm_provider="agl")
    # LiteLLM's proxy copies these attributes into the error body; the constructor would prefix the message.
    converted.message = error.message
    converted.param = error.param
    converted.code = error.code
    converted.type = error.type
    return converted


_LITELLM_ERRORS = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}


def install_error_handlers(app: FastAPI) -> None:
    """Answer every exception `app` raises through `api_error` (before it starts serving).

    LiteLLM's own handlers answer some refusals as `{"detail": ...}` or with the status in `code`;
    FastAPI's answer unknown paths and wrong methods with `{"detail": "Not Found"}`.
    """
    for kind in _HANDLED:
        app.add_exception_handler(kind, _answer)
    app.add_exception_handler(Exception, _answer_unexpected)


_HANDLED = (
    RequestError,
    StoreError,
    RemoteSamplerError,
    ProxyException,
    StarletteHTTPException,
    RequestValidationError,
)


async def _answer(request: Request, exc: Exception) -> JSONResponse:
    path = request.url.path
    return error_response(api_error(exc, method=request.method, path=path), protocol_of(path))


async def _answer_unexpected(request: Request, exc: Exception) -> JSONResponse:
    # LiteLLM's own catch-all handler itself fails without its optional database driver and
    # answers plain text; a bug still gets the documented shape, and the traceback goes to the log.
    logger.error("unexpected error serving %s %s", request.method, request.url.path, exc_info=exc)
    return await _answer(request, exc)


def with_word_codes(send: Send) -> Send:
    """`send` that rewrites `"code": "400"` (the status as a string) in JSON error bodies to a word.

    For responses LiteLLM writes itself, bypassing the exception handlers. Only error responses
    (4xx/5xx JSON) are held back and fixed; everything else passes through untouched.
    """
    held: dict[str, Message] = {}
    chunks: list[bytes] = []

    async def fixing_send(message: Message) -> None:
        if message["type"] == "http.response.start":
            if message["status"] >= 400 and b"json" in dict(message.get("headers") or []).get(b"content-type", b""):
                held["start"] = message
                return
        elif message["type"] == "http.response.body" and "start" in held:
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            start = held.pop("start")
            body = _with_word_code(b"".join(chunks), start["status"])
            headers = [(k, v) for k, v in start.get("headers") or [] if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await send(message)

    return fixing_send


def _with_word_code(body: bytes, status: int) -> bytes:
    try:
        document = json.loads(body)
    except ValueError:
        return body
    error = document.get("error") if isinstance(document, dict) else None
    if not isinstance(error, dict) or error.get("code") is None or word_code(error.get("code")) is not None:
        return body
    error["code"] = STATUS_CODES.get(status)
    return json.dumps(document).encode()


def word_code(value: object) -> str | None:
    """`code` as OpenAI sends it: a word such as "invalid_value", or None — never an HTTP status."""
    if value is None or isinstance(value, bool):
        return None
    text = str(value)
    return None if not text or text.isdigit() or text == "None" else text


def _type_for(status: int) -> str:
    if status == 401:
        return AUTHENTICATION
    return INVALID_REQUEST if status < 500 else SERVER_ERROR


def _text(value: object) -> str | None:
    """An error field as text: an enum's value (LiteLLM's error types are str enums), else str()."""
    if value is None:
        return None
    return str(value.value) if isinstance(value, enum.Enum) else str(value)


def _status(code: object) -> int:
    try:
        status = int(str(code))
    except ValueError:
        return 500
    return status if 400 <= status <= 599 else 500
