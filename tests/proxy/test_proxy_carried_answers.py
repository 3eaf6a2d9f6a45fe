"""Which earlier answers a request carries back (`LLMCall.carries`): found by text, recorded on the call.

A summary sent back as a user message, or a sub-agent's answer as a tool result, is re-tokenized: its
sampled ids rarely survive, its text does. The front door runs in-process over a sampler that answers
with fixed ids and a real store, as in test_proxy_call_declaration.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from shared_helpers import collect, new_id

from agl_bridge.chat import ChatCodec
from agl_bridge.convert.graph import build_graph
from agl_bridge.proxy.chat_route import ChatRoute
from agl_bridge.proxy.gateway import Gateway
from agl_bridge.proxy.recording import CallRecorder
from agl_bridge.proxy.service import ChatService
from agl_bridge.sampler.instant import InstantSampler
from agl_bridge.store import SQLiteStore
from agl_bridge.types import CallClass

KEY = "sk-right"
ANSWER = "the sub-agent found forty-two apples"


@pytest.fixture
async def door(tiny_tokenizer: Any, tmp_path: Path) -> AsyncIterator[tuple[Gateway, SQLiteStore]]:
    codec = ChatCodec(tiny_tokenizer)
    reply = tiny_tokenizer.encode(ANSWER, add_special_tokens=False) + [codec.stop_token_ids[0]]
    async with SQLiteStore(tmp_path / "store.sqlite") as store:
        service = ChatService(
            sampler=InstantSampler(reply, vocab_size=len(tiny_tokenizer)),
            codec=codec,
            recorder=CallRecorder(store),
            model_name="tiny",
        )

        async def litellm(scope: Any, receive: Any, send: Any) -> None:
            raise AssertionError("the served model's requests must not reach LiteLLM")

        yield Gateway(litellm, api_key=KEY, chat=ChatRoute({"tiny": service}.get)), store


async def chat(gateway: Gateway, rollout: str, messages: list[dict[str, Any]]) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway), base_url="http://front") as client:
        response = await client.post(
            f"/rollout/{rollout}/attempt/a1/v1/chat/completions",
            json={"model": "tiny", "messages": messages, "max_tokens": 16},
            headers={"Authorization": f"Bearer {KEY}"},
        )
    assert response.status_code == 200, response.text[:300]


async def test_an_answer_sent_back_in_a_tool_result_is_carried_and_makes_a_sub_agent(
    door: tuple[Gateway, SQLiteStore],
) -> None:
    gateway, store = door
    rollout = new_id("carry")
    task = [{"role": "system", "content": "You are the orchestrator."}, {"role": "user", "content": "count"}]
    await chat(gateway, rollout, task)  # 0: the orchestrator's turn (the tool call)
    await chat(
        gateway, rollout, [{"role": "system", "content": "You are a researcher."}, {"role": "user", "content": "go"}]
    )
    tool_call = {"id": "c1", "type": "function", "function": {"name": "research", "arguments": "{}"}}
    back = [
        *task,
        {"role": "assistant", "content": None, "tool_calls": [tool_call]},
        {"role": "tool", "tool_call_id": "c1", "content": f"Result: {ANSWER}."},
    ]
    await chat(gateway, rollout, back)  # 2: the sub-agent's answer comes back as a tool result
    calls = await collect(store.iter_llm_calls(rollout, "a1"))
    # The sampler gives every call the same ids: the cache keeps one entry per ids, the latest (call 1).
    assert [call.carries for call in calls] == [[], [], [1]]
    (tokens_only,) = [r async for r in store.iter_rollout_records([rollout], tokens_only=True)]
    assert [call.carries for call in tokens_only.attempts[0].calls] == [[], [], [1]]
    graph = build_graph(calls)
    assert graph.nodes[(1, 0)].call_class is CallClass.SUBAGENT


async def test_short_answers_and_assistant_messages_are_not_carried(door: tuple[Gateway, SQLiteStore]) -> None:
    gateway, store = door
    rollout = new_id("plain")
    task = [{"role": "user", "content": "hello"}]
    await chat(gateway, rollout, task)
    await chat(gateway, rollout, [*task, {"role": "assistant", "content": ANSWER}, {"role": "user", "content": "ok"}])
    calls = await collect(store.iter_llm_calls(rollout, "a1"))
    assert [call.carries for call in calls] == [[], []]  # sent back as the assistant's own turn: continued
