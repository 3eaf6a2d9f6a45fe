"""What LiteLLM's Anthropic bridge (litellm 1.106.2) leaves out of a served `/v1/messages` answer, put back.

The bridge turns our chat completion into Anthropic's Messages shape but
- always answers `stop_reason: "end_turn"` and `stop_sequence: null`, even when one of the
  request's `stop_sequences` ended the text (Anthropic: `"stop_sequence"` and the string);
- gives a non-streamed message the chat completion's id (`chatcmpl-…`) where Anthropic's are `msg_…`;
- opens a stream with `usage.input_tokens: 0`, written before the prompt was encoded.
The provider tells the front door what it knows (`request.BridgedCall`); `with_anthropic_fields`
rewrites those fields on the way out: the JSON message, or the `message_start` / `message_delta`
events of a stream (which the gateway holds until the provider has sampled, so the prompt's length
is known by then).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Message, Send

from agl_bridge.proxy.request import BridgedCall

_CHAT_ID_PREFIX = "chatcmpl-"
_EVENTS = (b'"message_start"', b'"message_delta"')


def with_anthropic_fields(send: Send, call: BridgedCall) -> Send:
    """`send` that completes a bridged Anthropic answer from `call` (JSON or event stream; errors untouched)."""
    held: dict[str, Message] = {}
    chunks: list[bytes] = []

    async def fixing_send(message: Message) -> None:
        if message["type"] == "http.response.start":
            content_type = dict(message.get("headers") or []).get(b"content-type", b"")
            if message["status"] == 200 and b"json" in content_type:
                held["start"] = message  # the body's length changes: held until the body is whole
                return
            if message["status"] == 200 and b"event-stream" in content_type:
                held["stream"] = message
        elif message["type"] == "http.response.body" and "start" in held:
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            start = held.pop("start")
            body = _fixed_message(b"".join(chunks), call)
            headers = [(k, v) for k, v in start.get("headers") or [] if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        elif message["type"] == "http.response.body" and "stream" in held:
            body = message.get("body", b"")
            if any(event in body for event in _EVENTS):
                message = {**message, "body": _fixed_events(body, call)}
        await send(message)

    return fixing_send


def _fixed_message(body: bytes, call: BridgedCall) -> bytes:
    try:
        document = json.loads(body)
    except ValueError:
        return body
    if not isinstance(document, dict) or document.get("type") != "message":
        return body
    message_id = document.get("id")
    if isinstance(message_id, str) and message_id.startswith(_CHAT_ID_PREFIX):
        document["id"] = "msg_" + message_id[len(_CHAT_ID_PREFIX) :]
    _set_stop(document, call)
    return json.dumps(document).encode()


def _fixed_events(body: bytes, call: BridgedCall) -> bytes:
    lines = body.split(b"\n")
    for number, line in enumerate(lines):
        if not line.startswith(b"data: ") or not any(event in line for event in _EVENTS):
            continue
        try:
            event = json.loads(line[len(b"data: ") :])
        except ValueError:
            continue
        if event.get("type") == "message_start" and call.prompt_tokens is not None:
            usage = (event.get("message") or {}).get("usage")
            if isinstance(usage, dict) and not usage.get("input_tokens"):
                usage["input_tokens"] = call.prompt_tokens
        elif event.get("type") == "message_delta" and isinstance(event.get("delta"), dict):
            _set_stop(event["delta"], call)
        lines[number] = b"data: " + json.dumps(event).encode()
    return b"\n".join(lines)


def _set_stop(fields: dict[str, Any], call: BridgedCall) -> None:
    """`stop_reason: "stop_sequence"` and the string, where one of the request's stop sequences ended the text."""
    if call.stop_sequence is not None and fields.get("stop_reason") == "end_turn":
        fields["stop_reason"] = "stop_sequence"
        fields["stop_sequence"] = call.stop_sequence
