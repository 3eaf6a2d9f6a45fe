"""smolagents through agl-bridge (`pip install "smolagents[openai]"`): `OpenAIServerModel` pointed
at the proxy, driving a `ToolCallingAgent`.

Run it as an `AgentCommand`: `OPENAI_BASE_URL` (routed to the rollout attempt), `OPENAI_API_KEY`,
`AGL_MODEL`, and `AGL_TASK` whose `turns` are the user messages of one conversation.
"""

from __future__ import annotations

import json
import os

from smolagents import OpenAIServerModel, ToolCallingAgent, tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer.
        b: the second integer.
    """
    return a + b


model = OpenAIServerModel(
    model_id=os.environ.get("AGL_MODEL", "tiny"),
    api_base=os.environ["OPENAI_BASE_URL"],
    api_key=os.environ["OPENAI_API_KEY"],
)
agent = ToolCallingAgent(tools=[add], model=model, max_steps=2, verbosity_level=0)
for number, turn in enumerate(json.loads(os.environ.get("AGL_TASK", "{}")).get("turns", ["Say hello."])):
    print(agent.run(turn, reset=number == 0))  # reset=False: the next task continues the same memory
