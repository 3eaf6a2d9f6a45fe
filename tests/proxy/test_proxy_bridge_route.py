"""The front door's Responses and Anthropic routes: LiteLLM's translations in-process, event streams in each
protocol's own framing, the opening events written with the first token."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from proxy_helpers import MODEL, auth, stored_calls
from shared_helpers import new_id

from agl_bridge.proxy.bridge_route import _opening_coalesced, _Source


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/messages"])
def test_each_event_names_its_type_and_the_call_is_recorded(proxy_server: Any, path: str) -> None:
    rid = new_id("events")
    body: dict[str, Any] = {"model": MODEL, "stream": True}
    if path == "/v1/responses":
        body |= {"input": "hi", "max_output_tokens": 4}
    else:
        body |= {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    answered = httpx.post(
        f"{proxy_server.base_url}/rollout/{rid}/attempt/a1{path}", json=body, headers=auth(proxy_server), timeout=60
    )
    assert answered.status_code == 200, answered.text[:300]
    lines = [line for line in answered.text.splitlines() if line]
    named = [(lines[i][len("event: ") :], json.loads(lines[i + 1][len("data: ") :])) for i in range(0, len(lines), 2)]
    assert named and all(kind == event["type"] for kind, event in named), lines[:4]
    ends = ("message_stop",) if path == "/v1/messages" else ("response.completed", "response.incomplete")
    assert named[-1][0] in ends
    (call,) = stored_calls(proxy_server, rid)
    assert call.prompt_token_ids and call.response_token_ids


async def test_the_opening_events_go_out_with_the_first_content() -> None:
    async def chunks() -> AsyncIterator[Any]:
        yield "first chunk"
        yield "second chunk"

    source = _Source(chunks())

    async def events() -> AsyncIterator[tuple[str, bytes]]:
        yield "response.created", b"response.created;"  # made before the first token
        await anext(source)
        for kind in ("response.in_progress", "response.output_text.delta"):
            yield kind, kind.encode() + b";"
        await anext(source)  # the next token: nothing opening is held past it
        yield "response.output_item.added", b"late;"
        yield "response.completed", b"done;"

    written = [data async for data in _opening_coalesced(events(), source)]
    assert written == [b"response.created;response.in_progress;response.output_text.delta;", b"late;", b"done;"]
