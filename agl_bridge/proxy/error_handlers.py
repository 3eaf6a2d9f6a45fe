"""Every error the proxy app answers, in OpenAI's shape with a meaningful `code`.

LiteLLM's own handlers answer some refusals in other shapes: an unknown path or a wrong method gets
Starlette's `{"detail": "Not Found"}`, a request that fails FastAPI's validation gets
`{"detail": [...]}`, and its `ProxyException` handler (and its stream error path) writes the HTTP
status as a string into `code` ("400"), dropping the code the refusal carried (e.g.
"invalid_value"). These handlers replace LiteLLM's for the app we serve, and a small middleware
fixes the responses LiteLLM writes itself, so a client always gets
`{"error": {"message", "type", "param", "code"}}`, with `code` a word.
"""

from __future__ import annotations

import enum
import json
import logging
from typing import Any

from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from agl_bridge.proxy.errors import INVALID_REQUEST, error_body

logger = logging.getLogger(__name__)
_STATUS_CODES = {
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


def install_error_handlers(app: Any) -> None:
    """Register the OpenAI-shaped handlers on LiteLLM's FastAPI app (before it starts serving)."""
    from litellm.proxy._types import ProxyException

    app.add_exception_handler(ProxyException, _proxy_exception)
    app.add_exception_handler(StarletteHTTPException, _http_exception)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected)
    app.add_middleware(ErrorCodeMiddleware)


class ErrorCodeMiddleware:
    """Rewrites `"code": "400"` (the status as a string) in JSON error responses to a word.

    LiteLLM writes some errors itself, bypassing the exception handlers: a stream whose first chunk
    is an error becomes a JSON error with `code` set to the status. Only error responses (4xx/5xx
    JSON) are buffered; everything else passes through untouched.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Pass the request on; hold back and fix an error response's body."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def fixing_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                content_type = dict(message.get("headers") or []).get(b"content-type", b"")
                if message["status"] >= 400 and b"json" in content_type:
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

        await self.app(scope, receive, fixing_send)


def _with_word_code(body: bytes, status: int) -> bytes:
    try:
        document = json.loads(body)
    except ValueError:
        return body
    error = document.get("error") if isinstance(document, dict) else None
    if not isinstance(error, dict) or openai_code(error.get("code")) is not None or error.get("code") is None:
        return body
    error["code"] = _STATUS_CODES.get(status)
    return json.dumps(document).encode()


def openai_code(value: object) -> str | None:
    """`code` as OpenAI sends it: a word such as "invalid_value", or null — never an HTTP status."""
    if value is None or isinstance(value, bool):
        return None
    text = str(value)
    return None if not text or text.isdigit() or text == "None" else text


async def _proxy_exception(request: Request, exc: Exception) -> JSONResponse:
    status = _status(getattr(exc, "code", None))
    param = getattr(exc, "param", None)
    body = error_body(
        str(getattr(exc, "message", exc)),
        type_=_text(getattr(exc, "type", None)) or INVALID_REQUEST,
        param=None if param in (None, "None") else str(param),
        code=openai_code(getattr(exc, "openai_code", None)) or _STATUS_CODES.get(status),
    )
    return JSONResponse(body, status_code=status, headers=dict(getattr(exc, "headers", None) or {}))


async def _http_exception(request: Request, exc: Exception) -> JSONResponse:
    status = int(getattr(exc, "status_code", 500))
    detail = getattr(exc, "detail", None)
    message = detail if isinstance(detail, str) and detail else "error"
    if status == 404:
        message = (
            f"no route {request.method} {request.url.path}; the API is under /v1 "
            "(or /rollout/ROLLOUT_ID/attempt/ATTEMPT_ID/v1)"
        )
    elif status == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    body = error_body(
        message, type_=INVALID_REQUEST if status < 500 else "server_error", code=_STATUS_CODES.get(status)
    )
    return JSONResponse(body, status_code=status, headers=dict(getattr(exc, "headers", None) or {}))


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    first = errors[0] if errors else {}
    location = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "path", "header")]
    param = ".".join(location) or None
    message = f"{param or 'the request'}: {first.get('msg', 'is invalid')}"
    return JSONResponse(error_body(message, param=param, code="invalid_value"), status_code=400)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    # LiteLLM's own catch-all handler itself fails without its optional database driver and
    # answers plain text; a bug still gets the documented shape, and the traceback goes to the log.
    logger.error("unexpected error serving %s %s", request.method, request.url.path, exc_info=exc)
    message = f"the server failed unexpectedly ({type(exc).__name__}); see the server log"
    return JSONResponse(error_body(message, type_="server_error", code="internal_error"), status_code=500)


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
