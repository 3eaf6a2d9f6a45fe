"""Checks of what a proxy answers and what its store holds, shared by the reliability tests and benchmarks."""

from __future__ import annotations

import os
import re
import sqlite3

import httpx


def openai_error_problem(response: httpx.Response) -> str | None:
    """Why `response` is not a 4xx OpenAI-style error, or None if it is one.

    The shape: `{"error": {"message": str, "type": str, "param": str|null, "code": str|int|null}}`;
    `code` is a word (or null), never the HTTP status repeated as a string.
    """
    if not 400 <= response.status_code < 500:
        return f"status {response.status_code} is not 4xx"
    try:
        body = response.json()
    except ValueError:
        return f"body is not JSON: {response.text[:200]!r}"
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], dict):
        return f"body is not {{'error': {{...}}}}: {body!r:.300}"
    error = body["error"]
    missing = {"message", "type", "param", "code"} - set(error)
    if missing:
        return f"error lacks {sorted(missing)}: {error!r:.300}"
    if not isinstance(error["message"], str) or not error["message"] or "Traceback" in error["message"]:
        return f"message is not a plain non-empty string: {error['message']!r:.300}"
    if not isinstance(error["type"], str) or not error["type"]:
        return f"type is not a string: {error['type']!r}"
    if error["param"] is not None and not isinstance(error["param"], str):
        return f"param is not a string or null: {error['param']!r}"
    code = error["code"]
    if code is not None and not isinstance(code, (str, int)) or isinstance(code, bool):
        return f"code is not a string, integer or null: {code!r}"
    if isinstance(code, str) and code.isdigit():
        return f"code is the HTTP status as a string ({code!r}), not an error code"
    return None


def anthropic_error_problem(response: httpx.Response) -> str | None:
    """Why `response` is not a 4xx Anthropic-style error, or None if it is one.

    The shape: `{"type": "error", "error": {"type": str, "message": str}}`.
    """
    if not 400 <= response.status_code < 500:
        return f"status {response.status_code} is not 4xx"
    try:
        body = response.json()
    except ValueError:
        return f"body is not JSON: {response.text[:200]!r}"
    if not isinstance(body, dict) or body.get("type") != "error" or not isinstance(body.get("error"), dict):
        return f"body is not {{'type': 'error', 'error': {{...}}}}: {body!r:.300}"
    error = body["error"]
    if not isinstance(error.get("type"), str) or not error["type"]:
        return f"error type is not a string: {error.get('type')!r}"
    message = error.get("message")
    if not isinstance(message, str) or not message or "Traceback" in message:
        return f"message is not a plain non-empty string: {message!r:.300}"
    return None


def error_problem(path: str, response: httpx.Response) -> str | None:
    """Why `response` to a request for `path` is not a 4xx error in that route's protocol's shape, or None."""
    from agl_bridge.proxy.errors import WireProtocol, protocol_of

    route = re.sub(r"^/rollout/[^/]*/attempt/[^/]*", "", path.split("?", 1)[0])
    if protocol_of(route) is WireProtocol.ANTHROPIC:
        return anthropic_error_problem(response)
    return openai_error_problem(response)


def integrity(path: str | os.PathLike[str]) -> str:
    """`PRAGMA integrity_check` of a SQLite file, from a fresh connection ("ok" when intact)."""
    with sqlite3.connect(path) as conn:
        return ";".join(row[0] for row in conn.execute("PRAGMA integrity_check"))
