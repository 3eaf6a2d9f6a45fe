"""Generated requests for the fuzz run: the hypothesis strategies and the check of each answer.

Shared by the CI fuzz test (a few hundred requests, derandomized) and `bench/reliability_fuzz.py`
(10,000+). Requests mix well-formed and malformed chat and completion bodies, odd field types and
values (NaN, huge integers, wrong types), odd rollout ids in paths and headers, OTLP bodies, unknown
paths and methods, bytes that are not JSON, and Anthropic Messages (and token count) / Responses
bodies and stored-response ids (`route_requests` draws for one route, half of them streamed where
the route streams). Every answer must be below 500; every error must be in its route's protocol's
shape (`error_problem`); a stream must be well-formed SSE without an error event.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from agl_bridge.testing.checks import error_problem

try:
    from hypothesis import strategies as st
except ImportError as exc:  # a dev dependency, not installed with the package
    raise ImportError(
        f"agl_bridge.testing.fuzz needs hypothesis ({exc}); install the dev extra: pip install 'agl-bridge[dev]'"
    ) from exc

MODEL = "tiny"
_SMALL_TOKENS = st.sampled_from([1, 2, 3])
"""Valid max_tokens stay small: generation is not what is tested, and a huge valid one (served up to the
context window, `test_a_max_tokens_past_the_window_samples_up_to_the_window`) would sample for minutes
on CPU when the random tiny model draws no EOS. Huge invalid ones (-10**20) are drawn."""
_ASCII = st.text(
    alphabet=string.ascii_letters + string.digits + string.punctuation + " ", max_size=12
)  # what a client can send in a header

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
_content = st.one_of(
    st.text(max_size=40),
    st.none(),
    st.integers(),
    json_values,
    st.lists(
        st.fixed_dictionaries(
            {
                "type": st.sampled_from(["text", "image_url", "x"]),
                "text": st.one_of(st.text(max_size=20), st.integers()),
            }
        ),
        max_size=3,
    ),
)
_tool = st.one_of(
    st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {"name": st.one_of(st.from_regex(r"[a-z_]{1,10}", fullmatch=True), st.integers(), st.text(max_size=5))},
                optional={"parameters": json_values, "description": st.text(max_size=10)},
            ),
        }
    ),
    json_values,
)
_message = st.one_of(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "user", "system", "assistant", "tool", "developer", "wizard", ""]),
            "content": _content,
        },
        optional={
            "tool_calls": st.lists(json_values, max_size=2),
            "tool_call_id": st.one_of(st.text(max_size=8), st.integers()),
            "name": st.text(max_size=8),
        },
    ),
    json_values,
)
_chat_options = {
    "n": st.sampled_from([1, 2, 0, -1, "2", 65, 10**9, 1.5, True]),
    "temperature": st.one_of(st.floats(), st.text(max_size=4), st.integers(-5, 5)),
    "top_p": st.one_of(st.floats(), st.integers(-2, 2), st.text(max_size=3)),
    "top_k": st.one_of(st.integers(-3, 5000), st.text(max_size=3), st.floats()),
    "stop": st.one_of(
        st.text(max_size=5), st.lists(st.one_of(st.text(max_size=5), st.integers()), max_size=5), st.integers()
    ),
    "seed": st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.text(max_size=4), st.floats()),
    "logprobs": st.one_of(st.booleans(), st.integers(-1, 3), st.text(max_size=3)),
    "top_logprobs": st.one_of(st.integers(-2, 25), st.text(max_size=3)),
    "stream": st.one_of(st.booleans(), st.sampled_from(["yes", 1, 0])),
    "stream_options": json_values,
    "tools": st.one_of(st.lists(_tool, max_size=3), json_values),
    "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required", "sometimes"]), json_values),
    "return_token_ids": json_values,
    "chat_template_kwargs": st.one_of(
        st.dictionaries(
            st.sampled_from(["enable_thinking", "add_generation_prompt", "x", "messages"]), json_values, max_size=2
        ),
        json_values,
    ),
    "max_completion_tokens": st.one_of(_SMALL_TOKENS, st.sampled_from([0, -3, "4", 2.5])),
    "response_format": json_values,
    "user": json_values,
    "frequency_penalty": json_values,
    "logit_bias": json_values,
    "metadata": json_values,
}
chat_bodies = st.fixed_dictionaries(
    {
        "model": st.one_of(
            st.just(MODEL), st.just(MODEL), st.just(MODEL), st.text(max_size=8), st.integers(), st.none()
        ),
        "messages": st.one_of(st.lists(_message, min_size=1, max_size=4), st.lists(_message, max_size=0), json_values),
        "max_tokens": st.one_of(_SMALL_TOKENS, _SMALL_TOKENS, st.sampled_from([0, -1, "2", 1.5, True, -(10**20)])),
    },
    optional=_chat_options,
)
completion_bodies = st.fixed_dictionaries(
    {
        "model": st.one_of(st.just(MODEL), st.just(MODEL), st.text(max_size=6), st.integers()),
        "prompt": st.one_of(
            st.lists(st.integers(-3, 2100), max_size=8),
            st.text(max_size=20),
            st.lists(st.one_of(st.lists(st.integers(0, 2100), max_size=5), st.text(max_size=5)), max_size=3),
            json_values,
        ),
        "max_tokens": st.one_of(_SMALL_TOKENS, st.sampled_from([0, -1, "2", None, -(10**20)])),
    },
    optional={
        k: _chat_options[k]
        for k in ("n", "temperature", "top_p", "top_k", "stop", "seed", "return_token_ids", "stream", "stream_options")
    }
    | {
        "echo": json_values,
        "best_of": json_values,
        "suffix": json_values,
        "prompt_logprobs": json_values,
        "unknown_field": json_values,
        "logprobs": st.one_of(st.integers(-1, 5), st.booleans(), st.none()),
        "stop_token_ids": json_values,
        "ignore_eos": json_values,
    },
)
_anthropic_block = st.one_of(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "image", "tool_use", "tool_result", "thinking", "x"])},
        optional={
            "text": st.one_of(st.text(max_size=20), st.integers()),
            "id": st.text(max_size=8),
            "name": st.text(max_size=8),
            "input": json_values,
            "tool_use_id": st.one_of(st.text(max_size=8), st.integers()),
            "content": json_values,
            "thinking": st.text(max_size=10),
        },
    ),
    json_values,
)
_anthropic_user_text = st.fixed_dictionaries({"role": st.just("user"), "content": st.text(max_size=20)})
_anthropic_message = st.one_of(
    _anthropic_user_text,
    _anthropic_user_text,
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "user", "assistant", "system", "x"]),
            "content": st.one_of(st.text(max_size=40), st.lists(_anthropic_block, max_size=3), json_values),
        }
    ),
    json_values,
)
anthropic_bodies = st.fixed_dictionaries(
    {
        "model": st.one_of(st.just(MODEL), st.just(MODEL), st.just(MODEL), st.text(max_size=8), st.integers()),
        "messages": st.one_of(st.lists(_anthropic_message, min_size=1, max_size=3), json_values),
        "max_tokens": st.one_of(_SMALL_TOKENS, _SMALL_TOKENS, st.sampled_from([0, -1, "2", 1.5, None, -(10**20)])),
    },
    optional={
        "system": st.one_of(st.text(max_size=20), st.lists(_anthropic_block, max_size=2), json_values),
        "stop_sequences": st.one_of(st.lists(st.text(max_size=4), max_size=3), json_values),
        "temperature": _chat_options["temperature"],
        "top_p": _chat_options["top_p"],
        "top_k": _chat_options["top_k"],
        "stream": _chat_options["stream"],
        "thinking": st.one_of(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["enabled", "disabled", "adaptive", "x"])},
                optional={"budget_tokens": st.one_of(st.integers(-5, 5000), json_values)},
            ),
            json_values,
        ),
        "tools": st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {"name": st.one_of(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), st.integers())},
                    optional={"description": st.text(max_size=8), "input_schema": json_values},
                ),
                max_size=2,
            ),
            json_values,
        ),
        "tool_choice": st.one_of(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["auto", "any", "none", "tool", "x"])},
                optional={"name": st.from_regex(r"[a-z_]{1,8}", fullmatch=True)},
            ),
            json_values,
        ),
        "metadata": json_values,
    },
)
_response_item = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "developer", "x"]), "content": _content}
    ),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning", "x"])},
        optional={
            "call_id": st.one_of(st.text(max_size=8), st.integers()),
            "name": st.text(max_size=8),
            "arguments": st.one_of(st.text(max_size=10), json_values),
            "output": json_values,
            "role": st.sampled_from(["user", "assistant"]),
            "content": _content,
        },
    ),
    json_values,
)
responses_bodies = st.fixed_dictionaries(
    {
        "model": st.one_of(st.just(MODEL), st.just(MODEL), st.just(MODEL), st.text(max_size=8), st.integers()),
        "input": st.one_of(st.text(max_size=40), st.lists(_response_item, min_size=1, max_size=3), json_values),
    },
    optional={
        "instructions": st.one_of(st.text(max_size=20), json_values),
        "max_output_tokens": st.one_of(_SMALL_TOKENS, _SMALL_TOKENS, st.sampled_from([0, -1, "2", 1.5, None])),
        "temperature": _chat_options["temperature"],
        "top_p": _chat_options["top_p"],
        "stream": _chat_options["stream"],
        "tools": st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {"type": st.sampled_from(["function", "web_search", "x"])},
                    optional={"name": st.text(max_size=8), "parameters": json_values, "strict": json_values},
                ),
                max_size=2,
            ),
            json_values,
        ),
        "tool_choice": json_values,
        "reasoning": st.one_of(
            st.fixed_dictionaries({"effort": st.sampled_from(["low", "high", "none", "huge", 3])}), json_values
        ),
        "previous_response_id": st.one_of(st.text(max_size=30), st.just("resp_" + "A" * 40), json_values),
        "text": json_values,
        "truncation": json_values,
        "store": json_values,
        "metadata": json_values,
        "logit_bias": json_values,
    },
)
otlp_bodies = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {
            "resourceSpans": st.lists(
                st.fixed_dictionaries(
                    {
                        "scopeSpans": st.lists(
                            st.fixed_dictionaries(
                                {
                                    "spans": st.lists(
                                        st.fixed_dictionaries(
                                            {
                                                "traceId": st.one_of(st.just("0" * 31 + "1"), st.text(max_size=32)),
                                                "spanId": st.one_of(st.just("0" * 15 + "2"), st.text(max_size=16)),
                                                "name": st.sampled_from(["agl.reward", "other", ""]),
                                                "attributes": st.lists(
                                                    st.fixed_dictionaries(
                                                        {
                                                            "key": st.sampled_from(
                                                                [
                                                                    "agl.rollout_id",
                                                                    "agl.reward.value",
                                                                    "agl.reward.name",
                                                                    "x",
                                                                ]
                                                            ),
                                                            "value": st.one_of(
                                                                st.fixed_dictionaries(
                                                                    {
                                                                        "doubleValue": st.one_of(
                                                                            st.floats(),
                                                                            st.sampled_from(["NaN", "Infinity", "x"]),
                                                                        )
                                                                    }
                                                                ),
                                                                st.fixed_dictionaries(
                                                                    {"stringValue": st.text(max_size=10)}
                                                                ),
                                                                json_values,
                                                            ),
                                                        }
                                                    ),
                                                    max_size=4,
                                                ),
                                            }
                                        ),
                                        max_size=2,
                                    )
                                }
                            ),
                            max_size=2,
                        )
                    }
                ),
                max_size=2,
            )
        }
    ),
)
_ids = st.one_of(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,20}", fullmatch=True), st.text(max_size=10))


@dataclass(frozen=True)
class FuzzRequest:
    """One generated request: method, path (rollout prefix included), headers and body bytes."""

    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


def _encode(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


ROUTES = ("chat", "completions", "messages", "count_tokens", "responses", "stored_responses")
"""The routes `route_requests` generates bodies for."""
_PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "messages": "/v1/messages",
    "count_tokens": "/v1/messages/count_tokens",
    "responses": "/v1/responses",
}
_STREAMED = frozenset({"chat", "completions", "messages", "responses"})


@st.composite
def route_requests(draw: st.DrawFn, route: str) -> FuzzRequest:
    """A generated request for one route (`ROUTES`), with or without a rollout prefix."""
    headers = {"content-type": "application/json"}
    prefix = draw(st.sampled_from(["", "", "/rollout/ro-fuzz/attempt/at-1"]))
    if route == "stored_responses":
        method, suffix = draw(
            st.sampled_from([("GET", ""), ("DELETE", ""), ("POST", "/cancel"), ("GET", "/input_items")])
        )
        response_id = quote(draw(st.one_of(st.text(max_size=30), st.just("resp_" + "QQ" * 30))), safe="") or "x"
        return FuzzRequest(method, f"{prefix}/v1/responses/{response_id}{suffix}", headers, b"")
    strategy = {
        "chat": chat_bodies,
        "completions": completion_bodies,
        "messages": anthropic_bodies,
        "count_tokens": anthropic_bodies,
        "responses": responses_bodies,
    }[route]
    body = draw(strategy)
    if route in _STREAMED and draw(st.booleans()):  # else whatever `stream` the body drew, if any
        body["stream"] = True
    return FuzzRequest("POST", prefix + _PATHS[route], headers, _encode(body))


@st.composite
def requests(draw: st.DrawFn) -> FuzzRequest:
    """A generated request; about half are chat completions, the rest spread over the other routes."""
    kind = draw(
        st.sampled_from(
            ["chat"] * 6 + ["rollout_chat"] * 2 + ["completions"] * 2 + ["bridged"] * 2 + ["traces", "raw", "other"]
        )
    )
    headers = {
        "content-type": draw(st.sampled_from(["application/json"] * 6 + ["text/plain", "application/x-protobuf", ""]))
    }
    if draw(st.integers(0, 9)) == 0:
        headers["x-rollout-id"] = draw(_ASCII.filter(lambda s: s.strip() == s))
        if draw(st.booleans()):
            headers["x-attempt-id"] = draw(_ASCII.filter(lambda s: s.strip() == s))
    if kind in ("chat", "rollout_chat"):
        body = _encode(draw(chat_bodies))
        path = (
            "/v1/chat/completions"
            if kind == "chat"
            else (f"/rollout/{quote(draw(_ids), safe='')}/attempt/{quote(draw(_ids), safe='')}/v1/chat/completions")
        )
        return FuzzRequest("POST", path, headers, body)
    if kind == "completions":
        return FuzzRequest(
            "POST",
            draw(st.sampled_from(["/v1/completions", "/completions"])),
            headers,
            _encode(draw(completion_bodies)),
        )
    if kind == "bridged":
        return draw(
            route_requests(draw(st.sampled_from(["messages", "count_tokens", "responses", "stored_responses"])))
        )
    if kind == "traces":
        return FuzzRequest("POST", "/v1/traces", headers, _encode(draw(otlp_bodies)))
    if kind == "raw":
        path = draw(st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/traces"]))
        return FuzzRequest("POST", path, headers, draw(st.binary(max_size=64)))
    method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]))
    path = draw(
        st.sampled_from(
            [
                "/v1/models",
                "/models",
                "/v1/nothing",
                "/rollout/r1",
                "/rollout/r1/attempt/a1/v1/x",
                "/v1/chat/completions",
                "/v1/embeddings",
                "/v1/responses",
            ]
        )
    )
    return FuzzRequest(method, path, headers, _encode(draw(json_values)))


def check_answer(request: FuzzRequest, response: httpx.Response) -> str | None:
    """Why the answer breaks a promise (a 5xx, an error not in its protocol's shape, a broken stream), or None."""
    if response.status_code >= 500:
        return f"{response.status_code}: {response.text[:300]}"
    if response.status_code >= 400:
        return error_problem(request.path, response)
    if "text/event-stream" in response.headers.get("content-type", ""):
        for line in response.text.splitlines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            try:
                event = json.loads(line[6:])
            except ValueError:
                return f"stream event is not JSON: {line[:200]!r}"
            if "error" in event and (event.get("error") or event.get("type") == "error"):
                return f"error inside a 200 stream: {line[:300]}"
            if isinstance(event, dict) and event.get("type") in ("error", "response.failed"):
                return f"error inside a 200 stream: {line[:300]}"
    return None


def send(client: httpx.Client, request: FuzzRequest, api_key: str) -> httpx.Response:
    """Send a generated request with the key (the key check itself is tested elsewhere)."""
    headers = {**{k: v for k, v in request.headers.items() if v}, "Authorization": f"Bearer {api_key}"}
    return client.request(request.method, request.path, headers=headers, content=request.body)
