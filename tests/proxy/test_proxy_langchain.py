"""LangChain's `ChatOpenAI` pointed at the proxy: invoke, stream, async, tool calls, multi-turn."""

from __future__ import annotations

from typing import Any

import pytest
from proxy_helpers import MODEL, decode, stored_calls, strip_end_of_turn
from shared_helpers import new_id

langchain_openai = pytest.importorskip("langchain_openai")
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402


def _chat(server: Any, rollout_id: str, **kwargs: Any) -> Any:
    return langchain_openai.ChatOpenAI(
        model=MODEL,
        base_url=server.openai_base_url(rollout_id, "at-1"),
        api_key=server.api_key,
        max_retries=0,
        timeout=60,
        **{"seed": 7, **kwargs},  # fixed draws: the random model cannot end a turn with <|endoftext|> by chance
    )


def test_invoke_returns_the_recorded_reply(proxy_server: Any, tiny_tokenizer: Any) -> None:
    rid = new_id("lc")
    reply = _chat(proxy_server, rid, max_completion_tokens=10, seed=2).invoke(f"[{rid}] hello")
    assert isinstance(reply, AIMessage)
    (call,) = stored_calls(proxy_server, rid)
    assert reply.content == call.response_text
    assert reply.content == decode(tiny_tokenizer, strip_end_of_turn(tiny_tokenizer, call.response_token_ids))
    assert reply.usage_metadata["output_tokens"] == len(call.response_token_ids)
    assert reply.usage_metadata["input_tokens"] == len(call.prompt_token_ids)
    assert call.messages == [{"role": "user", "content": f"[{rid}] hello"}]
    assert proxy_server.sampler.served_for(call.prompt_token_ids)[0][2].max_tokens == 10


def test_stream_joins_to_the_recorded_reply(proxy_server: Any) -> None:
    rid = new_id("lcstream")
    chunks = list(_chat(proxy_server, rid, max_completion_tokens=16).stream(f"[{rid}] hello"))
    assert len(chunks) > 2  # streamed, not one blob
    (call,) = stored_calls(proxy_server, rid)
    assert "".join(chunk.content for chunk in chunks) == call.response_text


async def test_async_invoke_and_multi_turn_extends_exactly(proxy_server: Any) -> None:
    rid = new_id("lcasync")
    chat = _chat(proxy_server, rid, max_completion_tokens=8)
    history: list[Any] = [HumanMessage(f"[{rid}] first")]
    history.append(await chat.ainvoke(history))
    history.append(HumanMessage("second"))
    await chat.ainvoke(history)
    first, second = stored_calls(proxy_server, rid)
    prefix = first.prompt_token_ids + first.response_token_ids
    assert second.prompt_token_ids[: len(prefix)] == prefix and second.prefix_breaks == []


def test_bound_tools_come_back_as_langchain_tool_calls(proxy_server: Any, tiny_tokenizer: Any) -> None:
    rid = new_id("lctool")
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
    proxy_server.sampler.script(rid, tiny_tokenizer.encode(text, add_special_tokens=False), times=1)

    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    chat = _chat(proxy_server, rid, max_completion_tokens=40).bind_tools([add])
    history: list[Any] = [HumanMessage(f"[{rid}] what is 2 + 3?")]
    reply = chat.invoke(history)
    assert [(c["name"], c["args"]) for c in reply.tool_calls] == [("add", {"a": 2, "b": 3})]
    history += [reply, ToolMessage("5", tool_call_id=reply.tool_calls[0]["id"])]
    chat.invoke(history)
    first, second = stored_calls(proxy_server, rid)
    prefix = first.prompt_token_ids + first.response_token_ids
    assert second.prompt_token_ids[: len(prefix)] == prefix and second.prefix_breaks == []
