"""Google ADK (`pip install "google-adk[openai]"`) through agl-bridge: ADK's own OpenAI model class
(`OpenAILlm`, Chat Completions) on the proxy, driving an `LlmAgent` in one session, so each turn's
prompt extends the last. (ADK's `LiteLlm(model="openai/...", api_base=..., api_key=...)` reaches
the proxy the same way, through LiteLLM.)

Run it as an `AgentCommand`: `OPENAI_BASE_URL` (routed to the rollout attempt), `OPENAI_API_KEY`,
`AGL_MODEL`, and `AGL_TASK` whose `turns` are the user messages of one conversation.
"""

from __future__ import annotations

import asyncio
import json
import os

from google.adk.agents import LlmAgent
from google.adk.integrations.openai import OpenAILlm
from google.adk.runners import InMemoryRunner
from google.genai import types


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def main() -> None:
    model = OpenAILlm(
        model=os.environ.get("AGL_MODEL", "tiny"),
        base_url=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"],
    )
    agent = LlmAgent(name="assistant", model=model, instruction="Be brief.", tools=[add])
    runner = InMemoryRunner(agent=agent, app_name="agl")
    session = await runner.session_service.create_session(app_name="agl", user_id="user")
    for turn in json.loads(os.environ.get("AGL_TASK", "{}")).get("turns", ["Say hello."]):
        message = types.Content(role="user", parts=[types.Part(text=turn)])
        async for event in runner.run_async(user_id="user", session_id=session.id, new_message=message):
            if event.is_final_response() and event.content and event.content.parts:
                print("".join(part.text or "" for part in event.content.parts))


if __name__ == "__main__":
    asyncio.run(main())
