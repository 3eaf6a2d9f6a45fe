"""pydantic-ai through agl-bridge (`pip install "pydantic-ai-slim[openai]"`): an OpenAI chat model
whose provider points at the proxy.

Run it as an `AgentCommand`: `OPENAI_BASE_URL` (routed to the rollout attempt), `OPENAI_API_KEY`,
`AGL_MODEL`, and `AGL_TASK` whose `turns` are the user messages of one conversation.
"""

from __future__ import annotations

import json
import os
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

provider = OpenAIProvider(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"])
agent = Agent(OpenAIChatModel(os.environ.get("AGL_MODEL", "tiny"), provider=provider), system_prompt="Be brief.")


@agent.tool_plain
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


history: list[Any] = []
for turn in json.loads(os.environ.get("AGL_TASK", "{}")).get("turns", ["Say hello."]):
    result = agent.run_sync(turn, message_history=history)
    print(result.output)
    history = result.all_messages()  # the next turn sends the whole conversation back
