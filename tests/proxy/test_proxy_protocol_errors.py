"""Each protocol's refusals in its own shape and wording, the same streamed or not; reasoning fields mapped
to the chat template's thinking switch; sampling fields the sampler cannot honour refused by name."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from proxy_helpers import MODEL, auth, stored_calls
from shared_helpers import new_id

from agl_bridge.proxy.errors import WireProtocol, api_error, error_body, protocol_of
from agl_bridge.proxy.request import RequestError
from agl_bridge.proxy.service import ChatService

LONG = "word " * 200_000  # refused by its length before it is tokenized
OVER = "hello " * 70_000  # tokenized, then found longer than the tiny model's 65,536-token context


def _body(path: str, text: str, stream: bool) -> dict[str, Any]:
    if path.endswith("/responses"):
        return {"model": MODEL, "input": text, "max_output_tokens": 4, "stream": stream}
    if path.endswith("/completions") and "chat" not in path:
        return {"model": MODEL, "prompt": text, "max_tokens": 4, "stream": stream}
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4, "stream": stream}


PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"]


@pytest.mark.parametrize("text", [LONG, OVER], ids=["by-length", "tokenized"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("path", PATHS)
def test_a_prompt_over_the_context_is_refused_in_each_protocols_words(
    proxy_server: Any, path: str, stream: bool, text: str
) -> None:
    rid = new_id("ctx")
    refused = httpx.post(
        f"{proxy_server.base_url}/rollout/{rid}/attempt/a1{path}",
        json=_body(path, text, stream),
        headers=auth(proxy_server),
        timeout=120,
    )
    assert refused.status_code == 400, refused.text[:300]  # before the stream starts: never 200 + an error event
    assert refused.headers["content-type"].startswith("application/json")
    body = refused.json()
    if path == "/v1/messages":
        assert body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["message"].startswith("prompt is too long")  # what Claude Code detects
    else:
        assert body["error"]["code"] == "context_length_exceeded"  # what opencode and Codex detect
        assert "maximum context length" in body["error"]["message"]  # what OpenAI's clients match
        assert body["error"]["param"] in ("messages", "prompt")
    assert stored_calls(proxy_server, rid) == []


def test_anthropic_routes_get_anthropic_errors_from_the_front_door(proxy_server: Any) -> None:
    no_key = httpx.post(f"{proxy_server.base_url}/v1/messages", json={"model": MODEL}, timeout=30)
    assert no_key.status_code == 401
    assert (no_key.json()["type"], no_key.json()["error"]["type"]) == ("error", "authentication_error")
    not_object = httpx.post(
        f"{proxy_server.base_url}/v1/messages", content=b"[1]", headers=auth(proxy_server), timeout=30
    )
    assert not_object.status_code == 400
    assert not_object.json()["error"]["type"] == "invalid_request_error"
    assert "request_body" in not_object.json()["error"]["message"]
    doubled = httpx.post(
        f"{proxy_server.base_url}/v1/v1/messages", json=_body("/v1/messages", "hi", False), headers=auth(proxy_server)
    )
    assert doubled.status_code == 404
    assert doubled.json()["error"]["type"] == "not_found_error"
    assert "drop /v1 from its base URL" in doubled.json()["error"]["message"]


def test_error_shapes_by_protocol() -> None:
    assert protocol_of("/v1/messages") is WireProtocol.ANTHROPIC
    assert protocol_of("/v1/messages/count_tokens") is WireProtocol.ANTHROPIC
    assert protocol_of("/v1/chat/completions") is WireProtocol.OPENAI
    assert protocol_of("/v1/responses") is WireProtocol.OPENAI
    assert protocol_of("/v1/threads/t1/messages") is WireProtocol.OPENAI  # OpenAI's Assistants API
    too_long = api_error(RequestError("prompt has 9 tokens", "messages", code="context_length_exceeded"))
    assert error_body(too_long, WireProtocol.ANTHROPIC) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": too_long.message},
    }
    assert too_long.message.startswith("prompt is too long") and "maximum context length" in too_long.message
    assert error_body(api_error(RequestError("gone", "x", status=503)), WireProtocol.ANTHROPIC)["error"] == {
        "type": "overloaded_error",
        "message": "x: gone",
    }


REASONING = [
    ("/v1/chat/completions", {"reasoning_effort": "low"}),
    ("/v1/chat/completions", {"reasoning_effort": "none"}),
    ("/v1/responses", {"reasoning": {"effort": "high", "summary": "auto"}}),
    ("/v1/messages", {"thinking": {"type": "enabled", "budget_tokens": 2048}}),
    ("/v1/messages", {"thinking": {"type": "disabled"}}),
]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize(("path", "extra"), REASONING, ids=[f"{p}-{sorted(e)[0]}" for p, e in REASONING])
def test_reasoning_fields_are_served_not_refused(proxy_server: Any, path: str, extra: dict, stream: bool) -> None:
    """The tiny model's template has no thinking switch: the fields are ignored (documented), never a 400."""
    rid = new_id("reason")
    answered = httpx.post(
        f"{proxy_server.base_url}/rollout/{rid}/attempt/a1{path}",
        json={**_body(path, "hi", stream), **extra},
        headers=auth(proxy_server),
        timeout=120,
    )
    assert answered.status_code == 200, answered.text[:300]
    assert len(stored_calls(proxy_server, rid)) == 1


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("/v1/chat/completions", {"reasoning_effort": "huge"}, "reasoning_effort"),
        ("/v1/responses", {"reasoning": {"effort": "huge"}}, "reasoning_effort"),
        ("/v1/chat/completions", {"logit_bias": {"5": 100}}, "logit_bias"),
        ("/v1/chat/completions", {"presence_penalty": 0.5}, "presence_penalty"),
        ("/v1/chat/completions", {"frequency_penalty": -1}, "frequency_penalty"),
        ("/v1/chat/completions", {"repetition_penalty": 1.1}, "repetition_penalty"),
        ("/v1/completions", {"logit_bias": {"5": 100}}, "logit_bias"),
        ("/v1/completions", {"presence_penalty": 0.5}, "presence_penalty"),
        ("/v1/responses", {"presence_penalty": 0.5}, "presence_penalty"),
        ("/v1/messages", {"presence_penalty": 0.5}, "presence_penalty"),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_sampling_fields_the_sampler_cannot_honour_are_refused_by_name(
    proxy_server: Any, path: str, extra: dict, param: str, stream: bool
) -> None:
    rid = new_id("unhonoured")
    refused = httpx.post(
        f"{proxy_server.base_url}/rollout/{rid}/attempt/a1{path}",
        json={**_body(path, "hi", stream), **extra},
        headers=auth(proxy_server),
        timeout=60,
    )
    assert refused.status_code == 400, refused.text[:300]
    error = refused.json()["error"]
    if path == "/v1/messages":
        assert error["type"] == "invalid_request_error" and param in error["message"]
    else:
        assert error["param"] == param, error
    assert stored_calls(proxy_server, rid) == []


def test_neutral_values_of_unhonoured_fields_are_accepted(proxy_server: Any) -> None:
    body = {**_body("/v1/chat/completions", "hi", False), "logit_bias": {}, "presence_penalty": 0, "min_p": None}
    answered = httpx.post(f"{proxy_server.base_url}/v1/chat/completions", json=body, headers=auth(proxy_server))
    assert answered.status_code == 200, answered.text[:300]


THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


@pytest.mark.parametrize(
    ("fields", "switch"),
    [
        ({"reasoning_effort": "none"}, False),
        ({"reasoning_effort": "medium"}, True),
        ({"reasoning_effort": {"effort": "low", "summary": "auto"}}, True),  # LiteLLM's bridge wraps it so
        ({"thinking": {"type": "disabled"}}, False),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, True),
        ({"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}}, True),  # explicit wins
        ({}, None),
    ],
)
def test_reasoning_fields_turn_the_templates_thinking_switch(
    tiny_tokenizer: Any, fields: dict, switch: bool | None
) -> None:
    from copy import deepcopy

    from agl_bridge.chat import ChatCodec

    tokenizer = deepcopy(tiny_tokenizer)
    tokenizer.chat_template = THINKING_TEMPLATE
    service = ChatService(sampler=_NoSampler(), codec=ChatCodec(tokenizer), recorder=None, model_name="t")  # type: ignore[arg-type]
    request = service.parse_request({"messages": [{"role": "user", "content": "hi"}], **fields})
    assert (request.chat_template_kwargs or {}).get("enable_thinking") == switch
    no_switch = ChatService(sampler=_NoSampler(), codec=ChatCodec(tiny_tokenizer), recorder=None, model_name="t")  # type: ignore[arg-type]
    ignored = no_switch.parse_request({"messages": [{"role": "user", "content": "hi"}], **fields})
    assert ignored.chat_template_kwargs == fields.get("chat_template_kwargs")


class _NoSampler:
    vocab_size = None
    max_context = 4096


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/messages", {"model": MODEL, "messages": None, "max_tokens": 1}, "messages"),
        (  # a 500 from LiteLLM's bridge before the check (found by the fuzzer)
            "/v1/messages",
            {"model": MODEL, "messages": [{"role": "user", "content": ""}], "max_tokens": 1, "tool_choice": {"": None}},
            "tool_choice.type",
        ),
        (
            "/v1/messages",
            {"model": MODEL, "messages": [{"role": "user", "content": 3}], "max_tokens": 1},
            "messages.0.content",
        ),
        ("/v1/messages", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ("/v1/messages", {"model": 0, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}, "model"),
        (
            "/v1/messages",
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t"}]}],
                "max_tokens": 1,
            },
            "messages.0.content.0.name",
        ),
        ("/v1/messages", {"model": "judge", "messages": [], "max_tokens": 1, "metadata": None}, "metadata"),
        ("/v1/responses", {"model": MODEL, "input": None}, "input"),
        ("/v1/responses", {"model": MODEL, "input": [{"type": "function_call", "name": "f"}]}, "input.0.call_id"),
        ("/v1/responses", {"model": MODEL, "input": "hi", "metadata": None}, "metadata"),
        ("/v1/responses", {"model": MODEL, "input": "hi", "tools": [{"type": "function"}]}, "tools.0.name"),
    ],
)
def test_malformed_bridged_bodies_are_refused_by_name_before_litellm(
    proxy_server: Any, path: str, body: dict[str, Any], param: str
) -> None:
    refused = httpx.post(f"{proxy_server.base_url}{path}", json=body, headers=auth(proxy_server), timeout=30)
    assert refused.status_code == 400, refused.text[:300]
    if path == "/v1/messages":
        assert refused.json()["type"] == "error" and param in refused.json()["error"]["message"]
    else:
        assert refused.json()["error"]["param"] == param
