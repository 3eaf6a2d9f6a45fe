"""The warm start trains on exactly the prompts the agent sends through the proxy.

The careless teacher's episodes are replayed by the real agent through the real proxy (the session's
`proxy_server`), its sampler scripted to answer each warm-start prompt with that pair's response ids: every
call the proxy records must then have the warm-start datum's prompt ids — system prompt, tools, the earlier
calls as sampled, the tool results — and the episode must end as the teacher's did.
"""

from __future__ import annotations

import random
import uuid
from types import SimpleNamespace
from typing import Any

import langgraph_tool_agent_helpers  # noqa: F401  (puts the example on the import path)
import pytest
from langgraph_tool_agent_helpers import prompt_and_response
from shop.agent import chat_model, play
from shop.tasks import phase_tasks
from shop.teacher import teacher_episode

from agl_bridge.chat import ChatCodec
from agl_bridge.train.warm_start import sft_datum

pytestmark = pytest.mark.slow

BROKEN_CALL = '<tool_call>\n{"name": "lookup_price", "arguments": {"item": "pear"}\n</tool_call>'


async def token_calls(store: Any, rollout_id: str) -> list[Any]:
    return [c async for c in store.iter_llm_calls(rollout_id) if c.kind == "token"]


def test_the_warm_start_prompts_are_the_prompts_the_proxy_records(proxy_server: Any, tiny_tokenizer: Any) -> None:
    codec = ChatCodec(tiny_tokenizer)
    tasks, seen = [], set()
    for task in phase_tasks("warm_start", 60, seed=9):
        if (task["item"], task["quantity"]) not in seen:  # one episode per opening question: its script is its own
            seen.add((task["item"], task["quantity"]))
            tasks.append(task)
    episodes = [
        teacher_episode(task, random.Random(index), rate, codec)
        for index, (task, rate) in enumerate(zip(tasks, (0.0, 0.0, 0.5, 0.5, 1.0), strict=False))
    ]
    broken_task = tasks[5]
    (opening, _), *_ = teacher_episode(broken_task, random.Random(0), 0.0, codec)[0]
    plays = [
        (task, pairs, (o.reward, o.reason, o.tool_calls)) for task, (pairs, o) in zip(tasks, episodes, strict=False)
    ]
    plays.append((broken_task, [(opening, BROKEN_CALL)], (0.0, "malformed tool call", ())))
    assert max(len(pairs) for _, pairs, _ in plays) == 3, "a full episode is among them"

    expected: dict[str, list[tuple[list[int], list[int]]]] = {}
    scripts = []
    for task, pairs, _ in plays:
        expected[task["id"]] = [prompt_and_response(sft_datum(codec, prompt, response)) for prompt, response in pairs]
        scripts += expected[task["id"]]
    # The sampler answers the first script whose text the prompt contains: a later turn's prompt contains the
    # earlier ones, so the longest go first.
    for prompt_ids, response_ids in sorted(scripts, key=lambda script: -len(script[0])):
        proxy_server.sampler.script(tiny_tokenizer.decode(prompt_ids), response_ids, times=1)

    for task, _, ending in plays:
        rollout_id = f"shop-prompts-{uuid.uuid4().hex[:8]}"
        endpoint = SimpleNamespace(
            base_url=proxy_server.openai_base_url(rollout_id, "0"),
            api_key=proxy_server.api_key,
            model=proxy_server.model_name,
        )
        outcome, _ = play(task, chat_model(endpoint))
        calls = proxy_server.run_coroutine(token_calls(proxy_server.store, rollout_id))
        recorded = [(call.prompt_token_ids, call.response_token_ids) for call in calls]
        assert recorded == expected[task["id"]], f"episode {task['id']}: the proxy's prompts are the warm start's"
        assert (outcome.reward, outcome.reason, outcome.tool_calls) == ending
