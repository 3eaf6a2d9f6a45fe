"""Tool calls end to end: `tools` + `tool_choice` through the official client, parsed from the ids the
sampler produced, streamed as tool-call deltas, and sent back in the next turn without breaking the
token-for-token extension of the rollout's prompts.

The random tiny model never writes a tool call by itself, so the session's `RecordingSampler` is
scripted: prompts that contain a marker get fixed ids (scored by the real model) as their response.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from proxy_helpers import MODEL, stored_calls
from shared_helpers import new_id, openai_client

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'


def _script(server: Any, tokenizer: Any, marker: str, text: str, times: int | None = None) -> list[int]:
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    server.sampler.script(marker, ids, times)
    return ids


def _ask(marker: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{marker}: what is the weather in Paris?"}]


def test_tool_call_is_parsed_from_the_sampled_ids(proxy_server: Any, tiny_tokenizer: Any) -> None:
    rid = new_id("tool")
    ids = _script(proxy_server, tiny_tokenizer, rid, CALL_TEXT)
    with openai_client(proxy_server, rid) as client:
        response = client.chat.completions.create(
            model=MODEL, messages=_ask(rid), tools=TOOLS, tool_choice="auto", extra_body={"return_token_ids": True}
        )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    (stored,) = stored_calls(proxy_server, rid)
    assert stored.response_token_ids == ids == choice.model_extra["token_ids"]
    assert stored.finish_reason == "tool_calls"
    # The prompt the sampler saw carries the tool definitions (rendered by the chat template).
    assert '"get_weather"' in tiny_tokenizer.decode(stored.prompt_token_ids)


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}], ids=["required", "named"]
)
def test_required_and_named_tool_choice_are_accepted(proxy_server: Any, tiny_tokenizer: Any, tool_choice: Any) -> None:
    rid = new_id("choice")
    _script(proxy_server, tiny_tokenizer, rid, CALL_TEXT)
    with openai_client(proxy_server, rid) as client:
        response = client.chat.completions.create(model=MODEL, messages=_ask(rid), tools=TOOLS, tool_choice=tool_choice)
    assert response.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_tool_choice_none_leaves_the_block_as_text(proxy_server: Any, tiny_tokenizer: Any) -> None:
    rid = new_id("nochoice")
    _script(proxy_server, tiny_tokenizer, rid, CALL_TEXT)
    with openai_client(proxy_server, rid) as client:
        response = client.chat.completions.create(model=MODEL, messages=_ask(rid), tools=TOOLS, tool_choice="none")
    choice = response.choices[0]
    assert choice.message.tool_calls is None
    assert choice.message.content == CALL_TEXT.removesuffix("<|im_end|>")
    assert choice.finish_reason == "stop"


def test_a_malformed_block_stays_in_the_content(proxy_server: Any, tiny_tokenizer: Any) -> None:
    rid = new_id("badblock")
    text = "Checking.\n<tool_call>\n{not json}\n</tool_call>"
    _script(proxy_server, tiny_tokenizer, rid, text + "<|im_end|>")
    with openai_client(proxy_server, rid) as client:
        response = client.chat.completions.create(model=MODEL, messages=_ask(rid), tools=TOOLS)
    assert response.choices[0].message.tool_calls is None
    assert response.choices[0].message.content == text
    assert response.choices[0].finish_reason == "stop"


def test_streamed_tool_call_with_content_before_it(proxy_server: Any, tiny_tokenizer: Any) -> None:
    rid = new_id("toolstream")
    ids = _script(proxy_server, tiny_tokenizer, rid, "Let me check.\n" + CALL_TEXT)
    with openai_client(proxy_server, rid) as client:
        chunks = list(
            client.chat.completions.create(
                model=MODEL, messages=_ask(rid), tools=TOOLS, stream=True, extra_body={"return_token_ids": True}
            )
        )
    choices = [chunk.choices[0] for chunk in chunks if chunk.choices]
    assert "".join(c.delta.content or "" for c in choices) == "Let me check."  # no <tool_call> markup leaks
    assert [t for c in choices for t in (c.model_extra or {}).get("token_ids", [])] == ids
    deltas = [d for c in choices for d in (c.delta.tool_calls or [])]
    assert {d.index for d in deltas} == {0}
    name = "".join(d.function.name or "" for d in deltas if d.function)
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert name == "get_weather" and json.loads(arguments) == {"city": "Paris"}
    assert [d.id for d in deltas if d.id][0].startswith("call_")
    assert [c.finish_reason for c in choices if c.finish_reason] == ["tool_calls"]
    (stored,) = stored_calls(proxy_server, rid)
    assert stored.response_token_ids == ids and stored.finish_reason == "tool_calls"


@pytest.mark.parametrize("stream_first_turn", [False, True], ids=["plain", "streamed"])
def test_sending_the_tool_call_back_extends_the_prompt_exactly(
    proxy_server: Any, tiny_tokenizer: Any, stream_first_turn: bool
) -> None:
    rid = new_id("roundtrip")
    _script(proxy_server, tiny_tokenizer, rid, "Let me check.\n" + CALL_TEXT, times=1)
    messages: list[Any] = _ask(rid)
    with openai_client(proxy_server, rid) as client:
        if stream_first_turn:
            chunks = [
                c.choices[0]
                for c in client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, stream=True)
                if c.choices
            ]
            deltas = [d for c in chunks for d in (c.delta.tool_calls or [])]
            assistant: Any = {
                "role": "assistant",
                "content": "".join(c.delta.content or "" for c in chunks),
                "tool_calls": [
                    {
                        "id": deltas[0].id,
                        "type": "function",
                        "function": {"name": deltas[0].function.name, "arguments": deltas[0].function.arguments},
                    }
                ],
            }
        else:
            first = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
            assistant = first.choices[0].message  # agents append the SDK object as it is
        call_id = assistant["tool_calls"][0]["id"] if isinstance(assistant, dict) else assistant.tool_calls[0].id
        messages += [assistant, {"role": "tool", "tool_call_id": call_id, "content": '{"temperature_c": 21}'}]
        second = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=5)
    assert second.choices[0].message.content is not None
    turn1, turn2 = stored_calls(proxy_server, rid)
    expected_prefix = turn1.prompt_token_ids + turn1.response_token_ids
    assert turn2.prompt_token_ids[: len(expected_prefix)] == expected_prefix
    assert len(turn2.prompt_token_ids) > len(expected_prefix)
    assert turn2.prefix_breaks == []
    assert "<tool_response>" in tiny_tokenizer.decode(turn2.prompt_token_ids[len(expected_prefix) :])
