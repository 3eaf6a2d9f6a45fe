"""The front door's Responses and Anthropic routes: answers and stream events written in each protocol's own
shape (the Responses ones valid as the `openai` package's types), streamed and not alike, the opening events
written with the first token; recorded like chat completions."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from proxy_helpers import MODEL, auth, stored_calls
from pydantic import TypeAdapter
from shared_helpers import new_id

from agl_bridge.chat import ChatCodec, PromptEncoding
from agl_bridge.proxy.anthropic_wire import AnthropicWriter
from agl_bridge.proxy.bridge_route import BridgeRoute
from agl_bridge.proxy.recording import CallRecorder
from agl_bridge.proxy.request import RolloutRoute
from agl_bridge.proxy.responses_wire import ResponsesWriter
from agl_bridge.proxy.service import ChatService
from agl_bridge.proxy.streaming import StreamDelta
from agl_bridge.sampler.instant import InstantSampler
from agl_bridge.store import SQLiteStore

STREAM_EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'


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


# ----------------------------------------------------------------------------- in-process, scripted answers


class _Scripted(InstantSampler):
    """Answers `text` (then the end-of-turn token), cut to max_tokens."""

    def __init__(self, codec: ChatCodec) -> None:
        super().__init__([0], vocab_size=len(codec.tokenizer))
        self.codec = codec

    def answer(self, text: str) -> None:
        ids = list(self.codec.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []
        self._response = [*ids, self.codec.stop_token_ids[0]]


class _Bridge:
    """The bridge route over a `ChatService` whose sampler answers what it is told, called without HTTP."""

    def __init__(self, service: ChatService, sampler: _Scripted) -> None:
        self.service = service
        self.sampler = sampler
        self.route = BridgeRoute()

    async def post(self, path: str, body: dict[str, Any], answer: str = "I'm here.") -> tuple[int, str]:
        """The status and body of the answer to `body` at `path` when the model samples `answer`."""
        self.sampler.answer(answer)
        sent: list[dict[str, Any]] = []

        async def send(message: Any) -> None:
            sent.append(message)

        async def receive() -> Any:
            await asyncio.Event().wait()  # the client never leaves

        scope = {"type": "http", "path": path, "method": "POST", "headers": [], "query_string": b"", "root_path": ""}
        route = RolloutRoute(new_id("wire"), "a1")
        await self.route(scope, receive, send, service=self.service, body={"model": MODEL, **body}, route=route)
        status = next(m["status"] for m in sent if m["type"] == "http.response.start")
        return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body").decode()


@pytest.fixture
async def bridge(tiny_tokenizer: Any, tmp_path: Path) -> AsyncIterator[_Bridge]:
    codec = ChatCodec(tiny_tokenizer)
    sampler = _Scripted(codec)
    async with SQLiteStore(tmp_path / "store.sqlite") as store:
        yield _Bridge(
            ChatService(sampler=sampler, codec=codec, recorder=CallRecorder(store), model_name=MODEL), sampler
        )


def _events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each event of an SSE body."""
    events = []
    for block in text.strip().split("\n\n"):
        name, data = block.split("\n")
        events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


RESPONSES_CASES = {
    "text": ({"input": "hi"}, "I'm here."),
    "cut": ({"input": "hi", "max_output_tokens": 2}, "I'm here."),
    "empty": ({"input": "hi"}, ""),
    "tool": (
        {"input": "weather?", "tools": [{"type": "function", "name": "weather", "parameters": WEATHER_SCHEMA}]},
        CALL,
    ),
    "text-and-tool": (
        {"input": "weather?", "tools": [{"type": "function", "name": "weather", "parameters": WEATHER_SCHEMA}]},
        "Let me see.\n" + CALL,
    ),
}


@pytest.mark.parametrize("case", RESPONSES_CASES)
async def test_responses_answers_are_openais_types_and_the_stream_ends_with_the_same_response(
    bridge: _Bridge, case: str
) -> None:
    body, answer = RESPONSES_CASES[case]
    status, text = await bridge.post("/v1/responses", body, answer)
    assert status == 200, text
    plain = Response.model_validate(json.loads(text))
    status, text = await bridge.post("/v1/responses", {**body, "stream": True}, answer)
    assert status == 200, text
    events = [(name, STREAM_EVENTS.validate_python(data)) for name, data in _events(text)]
    assert all(name == event.type for name, event in events)
    assert [event.sequence_number for _, event in events] == list(range(len(events)))
    kinds = [name for name, _ in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    streamed = events[-1][1].response
    assert kinds[-1] == ("response.incomplete" if case == "cut" else "response.completed")
    for response in (plain, streamed):
        assert response.status == ("incomplete" if case == "cut" else "completed")
        assert response.usage is not None and response.usage.total_tokens > response.usage.input_tokens
    deltas = "".join(event.delta for name, event in events if name == "response.output_text.delta")
    assert deltas == streamed.output_text == plain.output_text
    done = [event.item for name, event in events if name == "response.output_item.done"]
    assert [item.model_dump() for item in done] == [item.model_dump() for item in streamed.output]

    def shape(response: Response) -> list[Any]:  # the output without its generated ids
        return [(item.type, getattr(item, "name", None), getattr(item, "arguments", None)) for item in response.output]

    assert shape(plain) == shape(streamed)
    if case == "cut":
        assert plain.incomplete_details is not None and plain.incomplete_details.reason == "max_output_tokens"
    if "tool" in case:
        (call,) = [item for item in plain.output if item.type == "function_call"]
        assert (call.name, json.loads(call.arguments), call.id) == ("weather", {"city": "Paris"}, "fc_" + call.call_id)
        assert plain.tools[0].type == "function" and plain.tools[0].name == "weather"  # the request's tools, echoed
    assert [item.type for item in plain.output][:1] == (["function_call"] if case == "tool" else ["message"])


async def test_a_response_repeats_the_requests_fields(bridge: _Bridge) -> None:
    fields = {
        "instructions": "Be brief.",
        "metadata": {"run": "7"},
        "temperature": 0.5,
        "top_p": 0.9,
        "max_output_tokens": 16,
        "parallel_tool_calls": False,
        "reasoning": {"effort": "low"},
        "text": {"format": {"type": "text"}},
        "store": False,
        "user": "u1",
        "tool_choice": "none",
        "truncation": "disabled",
    }
    status, text = await bridge.post("/v1/responses", {"input": "hi", **fields})
    assert status == 200, text
    response = json.loads(text)
    assert {name: response[name] for name in fields} == fields
    assert response["id"].startswith("resp_") and response["object"] == "response"


ANTHROPIC_TOOLS = [{"name": "weather", "description": "Get the weather.", "input_schema": WEATHER_SCHEMA}]


@pytest.mark.parametrize(
    ("body", "answer", "content", "stop"),
    [
        ({}, "I'm here.", [{"type": "text", "text": "I'm here."}], ("end_turn", None)),
        ({"max_tokens": 2}, "I'm here.", [{"type": "text", "text": "I'm"}], ("max_tokens", None)),
        ({"stop_sequences": ["here"]}, "I'm here.", [{"type": "text", "text": "I'm "}], ("stop_sequence", "here")),
        ({}, "", [{"type": "text", "text": ""}], ("end_turn", None)),
        ({"tools": ANTHROPIC_TOOLS}, CALL, [{"type": "tool_use", "name": "weather", "input": {"city": "Paris"}}], None),
        (
            {"tools": ANTHROPIC_TOOLS},
            "Let me see.\n" + CALL,
            [
                {"type": "text", "text": "Let me see."},
                {"type": "tool_use", "name": "weather", "input": {"city": "Paris"}},
            ],
            ("tool_use", None),
        ),
    ],
    ids=["text", "cut", "stop-sequence", "empty", "tool", "text-and-tool"],
)
async def test_anthropic_messages_are_the_same_streamed_or_not(
    bridge: _Bridge,
    body: dict[str, Any],
    answer: str,
    content: list[dict[str, Any]],
    stop: tuple[str, str | None] | None,
) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64, **body}
    status, text = await bridge.post("/v1/messages", body, answer)
    assert status == 200, text
    message = json.loads(text)
    assert set(message) == {"id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"}
    assert message["id"].startswith("msg_") and (message["type"], message["role"]) == ("message", "assistant")
    assert [{k: v for k, v in block.items() if k != "id"} for block in message["content"]] == content
    assert (message["stop_reason"], message["stop_sequence"]) == (stop or ("tool_use", None))
    assert set(message["usage"]) == {"input_tokens", "output_tokens"}

    status, text = await bridge.post("/v1/messages", {**body, "stream": True}, answer)
    assert status == 200, text
    events = _events(text)
    assert all(name == event["type"] for name, event in events)
    start, *blocks, delta, end = [event for _, event in events]
    assert (start["type"], delta["type"], end["type"]) == ("message_start", "message_delta", "message_stop")
    assert start["message"]["usage"]["input_tokens"] == message["usage"]["input_tokens"]  # known when it opens
    assert start["message"]["id"].startswith("msg_agl-") and message["id"].startswith("msg_agl-")
    assert (delta["delta"]["stop_reason"], delta["delta"]["stop_sequence"]) == (
        message["stop_reason"],
        message["stop_sequence"],
    )
    assert delta["usage"]["output_tokens"] == message["usage"]["output_tokens"]
    rebuilt: list[dict[str, Any]] = []
    for event in blocks:  # the blocks, put together as a client does
        if event["type"] == "content_block_start":
            assert event["index"] == len(rebuilt)
            rebuilt.append(dict(event["content_block"]))
        elif event["type"] == "content_block_delta":
            block, piece = rebuilt[event["index"]], event["delta"]
            if piece["type"] == "text_delta":
                block["text"] += piece["text"]
            else:
                block["partial"] = block.get("partial", "") + piece["partial_json"]
        else:
            assert event == {"type": "content_block_stop", "index": len(rebuilt) - 1}
    for block in rebuilt:
        if "partial" in block:
            block["input"] = json.loads(block.pop("partial"))
    assert [{k: v for k, v in block.items() if k != "id"} for block in rebuilt] == content


async def test_a_shortened_tool_name_is_answered_with_the_clients(bridge: _Bridge) -> None:
    from litellm.llms.anthropic.pass_through.adapters.transformation import AnthropicAdapter

    long_name = "lookup_" + "x" * 70
    tools = [{"name": long_name, "input_schema": WEATHER_SCHEMA}]
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 400, "tools": tools}
    _, mapping = AnthropicAdapter().translate_completion_input_params_with_tool_mapping(
        {**body, "model": "agl/tiny"}, custom_llm_provider="agl"
    )
    (short,) = mapping  # the name the chat template shows the model
    status, text = await bridge.post("/v1/messages", body, CALL.replace("weather", short))
    assert status == 200, text
    assert json.loads(text)["content"][0]["name"] == long_name


async def test_n_is_refused_on_the_bridged_routes(bridge: _Bridge) -> None:
    status, text = await bridge.post("/v1/responses", {"input": "hi", "n": 2})
    assert status == 400 and json.loads(text)["error"]["param"] == "n"
    status, text = await bridge.post(
        "/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "n": 2}
    )
    assert status == 400 and json.loads(text)["type"] == "error" and "n" in json.loads(text)["error"]["message"]


@pytest.mark.parametrize("protocol", ["responses", "anthropic"])
def test_the_opening_events_go_out_with_the_first_token(protocol: str) -> None:
    writer = ResponsesWriter("resp_x", MODEL, 0, {}) if protocol == "responses" else AnthropicWriter("msg_x", MODEL, {})
    assert writer.events(PromptEncoding([1, 2, 3], "prompt")) == b""  # held: the client wakes once, at its first token
    first = _events(writer.events(StreamDelta(0, "Hi", [5], [-0.5])).decode())
    second = _events(writer.events(StreamDelta(0, " there", [6], [-0.5])).decode())
    if protocol == "responses":
        assert [name for name, _ in first] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
        ]
        assert [name for name, _ in second] == ["response.output_text.delta"]
    else:
        assert [name for name, _ in first] == ["message_start", "content_block_start", "content_block_delta"]
        assert first[0][1]["message"]["usage"]["input_tokens"] == 3
        assert [name for name, _ in second] == ["content_block_delta"]
