"""The OpenAI Agents SDK through agl-bridge, with either model kind: `--api responses` (the SDK's
default, `OpenAIResponsesModel`) or `--api chat` (`OpenAIChatCompletionsModel`).

Later turns send the whole conversation back (`result.to_input_list()`); with `--api responses
--server-history` they send only the new message and `previous_response_id` instead, leaving the
history to the server. `--reasoning-effort LEVEL` asks for a reasoning effort with every call.

Run it as an `AgentCommand` (or by hand with these variables set): `OPENAI_BASE_URL` is the proxy
routed to the rollout attempt, `OPENAI_API_KEY` its key, `AGL_MODEL` the served model and
`AGL_TASK` a JSON task whose `turns` are the user messages of one conversation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from typing import Any

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI
from openai.types.shared import Reasoning

set_tracing_disabled(True)  # otherwise the SDK uploads traces to OpenAI's servers (and needs an OpenAI key)


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def main(api: str, server_history: bool, reasoning_effort: str | None) -> None:
    client = AsyncOpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"])
    model_name = os.environ.get("AGL_MODEL", "tiny")
    if api == "responses":
        model: Any = OpenAIResponsesModel(model=model_name, openai_client=client)
    else:
        model = OpenAIChatCompletionsModel(model=model_name, openai_client=client)
    # The SDK raises on a response cut by its token limit (Responses `status: incomplete`): leave room.
    reasoning = Reasoning(effort=reasoning_effort) if reasoning_effort else None
    settings = ModelSettings(max_tokens=4096, reasoning=reasoning)
    agent = Agent(name="assistant", instructions="Be brief.", model=model, tools=[add], model_settings=settings)
    history: list[Any] = []
    previous_response_id = None
    for turn in json.loads(os.environ.get("AGL_TASK", "{}")).get("turns", ["Say hello."]):
        message = {"role": "user", "content": turn}
        if server_history:
            result = await Runner.run(agent, [message], previous_response_id=previous_response_id, max_turns=3)
            previous_response_id = result.last_response_id
        else:
            result = await Runner.run(agent, [*history, message], max_turns=3)
            history = result.to_input_list()  # the whole conversation, so the next turn extends it
        print(result.final_output)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--api", choices=["responses", "chat"], default="responses")
    parser.add_argument("--server-history", action="store_true", help="chain turns with previous_response_id")
    parser.add_argument("--reasoning-effort", choices=["minimal", "low", "medium", "high"])
    args = parser.parse_args()
    asyncio.run(main(args.api, args.server_history, args.reasoning_effort))
