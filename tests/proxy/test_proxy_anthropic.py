"""Anthropic's `/v1/messages` as its spec says, streamed or not: `msg_` ids, `stop_reason: "stop_sequence"` with
the `stop_sequence` that ended the text, usage with the prompt's real length; `count_tokens` counts with the
served tokenizer and chat template; the chat route's usage chunk has no choices, as OpenAI's; embeddings are
refused, naming the route."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from proxy_helpers import MODEL, auth, stored_calls
from shared_helpers import new_id

STOPS = ["e", "a", "o", "i", "t", "n", "s", " "]  # the random tiny model writes one of these within 64 tokens


def _messages(server: Any, rid: str, stream: bool, **extra: Any) -> httpx.Response:
    body = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return httpx.post(
        f"{server.base_url}/rollout/{rid}/attempt/a1/v1/messages",
        json={**body, **extra},
        headers=auth(server),
        timeout=60,
    )


def _events(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: ") :]) for line in response.text.splitlines() if line.startswith("data: ")]


def test_a_stop_sequence_is_reported_as_anthropic_does(proxy_server: Any, tiny_tokenizer: Any) -> None:
    rid = new_id("stopseq")
    answered = _messages(proxy_server, rid, False, stop_sequences=STOPS)
    assert answered.status_code == 200, answered.text
    message = answered.json()
    assert message["id"].startswith("msg_")
    assert message["stop_reason"] == "stop_sequence", message
    (call,) = stored_calls(proxy_server, rid)
    text = message["content"][0]["text"] if message["content"] else ""
    sampled = tiny_tokenizer.decode(call.response_token_ids)
    assert sampled.startswith(text + message["stop_sequence"])  # the earliest stop in what was sampled
    assert message["usage"] == {
        "input_tokens": len(call.prompt_token_ids),
        "output_tokens": len(call.response_token_ids),
    }


def test_a_streamed_stop_sequence_and_usage_are_reported_as_anthropic_does(proxy_server: Any) -> None:
    rid = new_id("stopseq-stream")
    answered = _messages(proxy_server, rid, True, stop_sequences=STOPS)
    assert answered.status_code == 200, answered.text
    events = _events(answered)
    start = next(e for e in events if e["type"] == "message_start")
    delta = next(e for e in events if e["type"] == "message_delta")
    (call,) = stored_calls(proxy_server, rid)
    assert start["message"]["id"].startswith("msg_")
    assert start["message"]["usage"]["input_tokens"] == len(call.prompt_token_ids)  # not 0: known when it is sent
    assert delta["delta"]["stop_reason"] == "stop_sequence" and delta["delta"]["stop_sequence"] in STOPS
    assert delta["usage"]["output_tokens"] == len(call.response_token_ids)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_without_a_stop_sequence_the_stop_reason_is_the_models(proxy_server: Any, stream: bool) -> None:
    rid = new_id("nostop")
    answered = _messages(proxy_server, rid, stream, max_tokens=3)
    assert answered.status_code == 200, answered.text
    if stream:
        delta = next(e for e in _events(answered) if e["type"] == "message_delta")["delta"]
    else:
        delta = answered.json()
        assert delta["id"].startswith("msg_")
    (call,) = stored_calls(proxy_server, rid)
    assert delta["stop_reason"] == ("max_tokens" if call.finish_reason == "length" else "end_turn")
    assert delta.get("stop_sequence") is None


def test_the_chat_routes_usage_chunk_has_no_choices(proxy_server: Any) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    answered = httpx.post(f"{proxy_server.base_url}/v1/chat/completions", json=body, headers=auth(proxy_server))
    chunks = [json.loads(line[6:]) for line in answered.text.splitlines() if line.startswith("data: {")]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1
    assert all(chunk["choices"] for chunk in chunks[:-1])


def test_count_tokens_counts_the_prompt_the_served_call_samples_from(proxy_server: Any) -> None:
    rid = new_id("count")
    body = {
        "model": MODEL,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "How many tokens is this?"}],
        "tools": [{"name": "clock", "description": "Tell the time.", "input_schema": {"type": "object"}}],
    }
    counted = httpx.post(
        f"{proxy_server.base_url}/rollout/{rid}/attempt/a1/v1/messages/count_tokens",
        json=body,
        headers=auth(proxy_server),
        timeout=60,
    )
    assert counted.status_code == 200, counted.text
    assert stored_calls(proxy_server, rid) == []  # counting samples and records nothing
    answered = _messages(proxy_server, rid, False, **body, max_tokens=2)
    assert answered.status_code == 200, answered.text
    (call,) = stored_calls(proxy_server, rid)
    assert counted.json() == {"input_tokens": len(call.prompt_token_ids)}
    refused = httpx.post(
        f"{proxy_server.base_url}/v1/messages/count_tokens",
        json={"model": MODEL, "messages": None},
        headers=auth(proxy_server),
        timeout=60,
    )
    assert refused.status_code == 400 and refused.json()["type"] == "error"
    assert "messages" in refused.json()["error"]["message"]


def test_embeddings_are_refused_naming_the_route(proxy_server: Any) -> None:
    refused = httpx.post(
        f"{proxy_server.base_url}/v1/embeddings", json={"model": MODEL, "input": "hi"}, headers=auth(proxy_server)
    )
    assert refused.status_code == 501, refused.text
    error = refused.json()["error"]
    assert (error["param"], error["code"]) == ("model", "unsupported")
    assert "/v1/embeddings" in error["message"]
