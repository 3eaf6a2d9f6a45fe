"""Rollout routing: the per-rollout base URL and the x-rollout-id / x-attempt-id headers attribute
calls; calls with neither are recorded outside any rollout; concurrent rollouts never mix."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
from proxy_helpers import MODEL, all_calls, stored_calls
from shared_helpers import new_id


def _ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_url_prefix_attributes_the_call(proxy_server: Any) -> None:
    rid, aid = new_id("url"), new_id("att")
    with openai.OpenAI(
        base_url=proxy_server.openai_base_url(rid, aid), api_key=proxy_server.api_key, max_retries=0
    ) as client:
        client.chat.completions.create(model=MODEL, messages=_ask(f"[{rid}]"), max_tokens=2)
    (call,) = stored_calls(proxy_server, rid, aid)
    assert (call.rollout_id, call.attempt_id, call.sequence) == (rid, aid, 0)


def test_headers_attribute_the_call_with_the_agent_name(proxy_server: Any) -> None:
    rid, aid = new_id("hdr"), new_id("att")
    headers = {"x-rollout-id": rid, "x-attempt-id": aid, "x-agent-name": "planner"}
    with openai.OpenAI(base_url=proxy_server.openai_base_url(), api_key=proxy_server.api_key, max_retries=0) as client:
        client.chat.completions.create(model=MODEL, messages=_ask(f"[{rid}]"), max_tokens=2, extra_headers=headers)
    (call,) = stored_calls(proxy_server, rid, aid)
    assert (call.rollout_id, call.attempt_id, call.agent_name) == (rid, aid, "planner")


def test_url_prefix_wins_over_conflicting_headers(proxy_server: Any) -> None:
    rid, other = new_id("win"), new_id("other")
    with openai.OpenAI(
        base_url=proxy_server.openai_base_url(rid, "a1"), api_key=proxy_server.api_key, max_retries=0
    ) as client:
        client.chat.completions.create(
            model=MODEL,
            messages=_ask(f"[{rid}]"),
            max_tokens=2,
            extra_headers={"x-rollout-id": other, "x-attempt-id": "a9"},
        )
    assert len(stored_calls(proxy_server, rid, "a1")) == 1
    assert stored_calls(proxy_server, other) == []


def test_rollout_header_without_attempt_is_attributed_to_the_rollout(proxy_server: Any) -> None:
    rid = new_id("noatt")
    response = httpx.post(
        f"{proxy_server.base_url}/v1/chat/completions",
        json={"model": MODEL, "messages": _ask(f"[{rid}]"), "max_tokens": 2},
        headers={"Authorization": f"Bearer {proxy_server.api_key}", "x-rollout-id": rid},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    (call,) = stored_calls(proxy_server, rid)
    assert (call.rollout_id, call.attempt_id) == (rid, None)


def test_calls_without_a_rollout_are_recorded_outside_any(proxy_server: Any) -> None:
    marker = new_id("loose")
    with openai.OpenAI(base_url=proxy_server.openai_base_url(), api_key=proxy_server.api_key, max_retries=0) as client:
        for _ in range(2):
            client.chat.completions.create(model=MODEL, messages=_ask(f"[{marker}]"), max_tokens=2)
    mine = [c for c in all_calls(proxy_server) if c.messages == _ask(f"[{marker}]")]
    assert len(mine) == 2
    assert all(c.rollout_id is None and c.attempt_id is None for c in mine)
    assert mine[0].sequence < mine[1].sequence  # they share the "no rollout" sequence space
    attributed = proxy_server.run_coroutine(_texts(proxy_server))
    assert f"[{marker}]" not in attributed  # iter_llm_calls() lists rollout calls only


async def _texts(server: Any) -> set[str]:
    return {m["content"] async for c in server.store.iter_llm_calls() for m in c.messages if m["role"] == "user"}


async def test_64_concurrent_rollouts_never_mix(proxy_server: Any) -> None:
    rollouts = [new_id(f"many{i}") for i in range(64)]
    shared = httpx.AsyncClient(limits=httpx.Limits(max_connections=64), timeout=120)

    async def agent(rid: str) -> None:
        client = openai.AsyncOpenAI(
            base_url=proxy_server.openai_base_url(rid, "a1"),
            api_key=proxy_server.api_key,
            max_retries=0,
            http_client=shared,
        )
        messages: list[dict[str, str]] = [{"role": "user", "content": f"I am {rid}."}]
        first = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": f"Still {rid}."},
        ]
        await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)

    try:
        await asyncio.gather(*(agent(rid) for rid in rollouts))
    finally:
        await shared.aclose()
    for rid in rollouts:
        calls = stored_calls(proxy_server, rid, "a1")
        assert [c.sequence for c in calls] == [0, 1], rid
        for call in calls:
            users = [m["content"] for m in call.messages if m["role"] == "user"]
            assert users and all(rid in text for text in users), (rid, users)
            others = [r for r in rollouts if r != rid and any(r in text for text in users)]
            assert others == []
        first, second = calls
        prefix = first.prompt_token_ids + first.response_token_ids  # whichever stop token ended the turn
        assert second.prompt_token_ids[: len(prefix)] == prefix  # each rollout's token cache is its own
