"""AutoGen (`pip install autogen-agentchat "autogen-ext[openai]"`) through agl-bridge: an
`OpenAIChatCompletionClient` on the proxy driving an `AssistantAgent`, which keeps the conversation
between runs, so each turn's prompt extends the last.

A model AutoGen does not know needs its `model_info`. Run it as an `AgentCommand`:
`OPENAI_BASE_URL` (routed to the rollout attempt), `OPENAI_API_KEY`, `AGL_MODEL`, and `AGL_TASK`
whose `turns` are the user messages of one conversation.
"""

from __future__ import annotations

import asyncio
import json
import os

from autogen_agentchat.agents import AssistantAgent
from autogen_ext.models.openai import OpenAIChatCompletionClient


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def main() -> None:
    client = OpenAIChatCompletionClient(
        model=os.environ.get("AGL_MODEL", "tiny"),
        base_url=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"],
        model_info={
            "family": "unknown",
            "vision": False,
            "function_calling": True,
            "json_output": False,
            "structured_output": False,
        },
    )
    agent = AssistantAgent("assistant", model_client=client, tools=[add], system_message="Be brief.")
    try:
        for turn in json.loads(os.environ.get("AGL_TASK", "{}")).get("turns", ["Say hello."]):
            result = await agent.run(task=turn)
            print(result.messages[-1].to_text())
    finally:
        await client.close()


if __name__ == "__main__":
    asyncio.run(main())
