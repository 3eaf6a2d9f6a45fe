"""Server-sent events as OpenAI's streaming routes write them: `data: <json>` events, `[DONE]`, and the
`stream` / `stream_options` fields that ask for them (validated, a `RequestError` naming the field)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agl_bridge.proxy.request import RequestError, flag_field

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
"""Headers of every event stream: nothing between the client and us may cache or buffer it."""
SSE_DONE = b"data: [DONE]\n\n"
"""The event that ends an OpenAI stream."""


def sse_data(payload: Mapping[str, Any]) -> bytes:
    """One `data:` event holding `payload` as JSON."""
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def stream_options(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """(`stream`, `stream_options.include_usage`), validated."""
    stream = flag_field(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        message = f'stream_options must be an object like {{"include_usage": true}}, got {options!r:.100}'
        raise RequestError(message, "stream_options")
    include_usage = options.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise RequestError(
            f"stream_options.include_usage must be true or false, got {include_usage!r:.100}",
            "stream_options.include_usage",
        )
    return stream, bool(include_usage)
