"""The same tools render the same prompt whichever protocol carried them (LiteLLM's Anthropic and Responses
bridges rewrite tool schemas — key order, `strict: false` — before our chat template sees them)."""

from __future__ import annotations

from typing import Any

import httpx
from proxy_helpers import MODEL, auth, stored_calls
from shared_helpers import new_id

from agl_bridge.chat import normalize_tools

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "the city"}, "days": {"type": "integer"}},
    "required": ["city"],
}
TOOLS = {
    "/v1/chat/completions": [
        {"type": "function", "function": {"name": "weather", "description": "Get the weather.", "parameters": SCHEMA}},
        {"type": "function", "function": {"name": "clock", "description": "Tell the time.", "parameters": SCHEMA}},
    ],
    "/v1/responses": [
        {"type": "function", "name": "weather", "description": "Get the weather.", "parameters": SCHEMA},
        {"type": "function", "name": "clock", "description": "Tell the time.", "parameters": SCHEMA},
    ],
    "/v1/messages": [
        {"name": "weather", "description": "Get the weather.", "input_schema": SCHEMA},
        {"name": "clock", "description": "Tell the time.", "input_schema": SCHEMA},
    ],
}


def test_the_same_tools_give_the_same_prompt_over_every_protocol(proxy_server: Any) -> None:
    prompts = {}
    for path, tools in TOOLS.items():
        rid = new_id("tools")
        body: dict[str, Any] = {"model": MODEL, "tools": tools}
        if path == "/v1/responses":
            body |= {"input": "What is the weather?", "max_output_tokens": 2}
        else:
            body |= {"messages": [{"role": "user", "content": "What is the weather?"}], "max_tokens": 2}
        answered = httpx.post(
            f"{proxy_server.base_url}/rollout/{rid}/attempt/a1{path}", json=body, headers=auth(proxy_server), timeout=60
        )
        assert answered.status_code == 200, (path, answered.text[:300])
        (call,) = stored_calls(proxy_server, rid)
        prompts[path] = call.prompt_token_ids
    chat = prompts.pop("/v1/chat/completions")
    assert all(ids == chat for ids in prompts.values()), "a bridge changed the rendered tools"


def test_tools_are_canonical_whatever_their_key_order() -> None:
    bridged = [
        {"type": "function", "function": {"name": "f", "parameters": SCHEMA, "description": "d"}},
        {"type": "function", "function": {"name": "g", "description": "d", "parameters": SCHEMA, "strict": False}},
        {"type": "function", "function": {"strict": True, "parameters": SCHEMA, "name": "h"}},
    ]
    assert normalize_tools(bridged) == [
        {"type": "function", "function": {"name": "f", "description": "d", "parameters": SCHEMA}},
        {"type": "function", "function": {"name": "g", "description": "d", "parameters": SCHEMA}},
        {"type": "function", "function": {"name": "h", "parameters": SCHEMA, "strict": True}},
    ]
    assert [list(t["function"]) for t in normalize_tools(bridged) or []] == [
        ["name", "description", "parameters"],
        ["name", "description", "parameters"],
        ["name", "parameters", "strict"],
    ]
