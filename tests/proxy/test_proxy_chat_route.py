"""The chat route's failures: before the first chunk a JSON error with its status, after it an `error` event."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from agl_bridge.chat import ChatCodec
from agl_bridge.proxy.chat_route import ChatRoute
from agl_bridge.proxy.gateway import Gateway
from agl_bridge.proxy.recording import CallRecorder
from agl_bridge.proxy.service import ChatService
from agl_bridge.sampler.instant import InstantSampler
from agl_bridge.store.errors import StoreClosedError


class _ClosedStore:
    """A store whose every write fails as a closed store's does."""

    async def add_llm_call(self, call: Any) -> int:
        raise StoreClosedError("the store is closed")

    async def add_llm_calls(self, calls: Any) -> list[int]:
        raise StoreClosedError("the store is closed")


@pytest.fixture
def front_door(tiny_tokenizer: Any) -> Gateway:
    codec = ChatCodec(tiny_tokenizer)
    reply = tiny_tokenizer.encode("one two three", add_special_tokens=False) + [codec.stop_token_ids[0]]
    service = ChatService(
        sampler=InstantSampler(reply, vocab_size=len(tiny_tokenizer)),
        codec=codec,
        recorder=CallRecorder(_ClosedStore()),  # type: ignore[arg-type]
        model_name="tiny",
    )

    async def litellm(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the served model's chat must not reach LiteLLM")

    return Gateway(litellm, api_key="sk-right", chat=ChatRoute({"tiny": service}.get))


async def _post(gateway: Gateway, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway), base_url="http://front") as client:
        return await client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-right"})


async def test_a_call_that_cannot_be_recorded_is_not_served(front_door: Gateway) -> None:
    response = await _post(front_door, {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "store_unavailable"


async def test_a_stream_that_fails_after_its_first_chunk_ends_with_an_error_event(front_door: Gateway) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    response = await _post(front_door, body)
    assert response.status_code == 200
    events = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    assert "[DONE]" not in events
    *chunks, last = (json.loads(event) for event in events)
    assert chunks and all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert last["error"]["code"] == "store_unavailable" and last["error"]["type"] == "server_error"


async def test_stream_options_are_validated(front_door: Gateway) -> None:
    for body, param in (
        ({"stream": "yes"}, "stream"),
        ({"stream": True, "stream_options": []}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
    ):
        response = await _post(front_door, {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **body})
        assert response.status_code == 400 and response.json()["error"]["param"] == param
