"""CrewAI through agl-bridge: a CrewAI `LLM` on the proxy (LiteLLM's `openai/` route), one `Agent`
run on the growing conversation, so each turn's prompt extends the last.

Offline, CrewAI needs `CREWAI_DISABLE_TELEMETRY=true CREWAI_DISABLE_TRACKING=true
CREWAI_TRACING_ENABLED=false CREWAI_TESTING=true` and LiteLLM `LITELLM_LOCAL_MODEL_COST_MAP=True`
(set below unless the caller set them). Run it as an `AgentCommand`: `OPENAI_BASE_URL` (routed to
the rollout attempt), `OPENAI_API_KEY`, `AGL_MODEL`, and `AGL_TASK` whose `turns` are the user
messages of one conversation.
"""

from __future__ import annotations

import json
import os

for name, value in {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_DISABLE_TRACKING": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "CREWAI_TESTING": "true",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
}.items():
    os.environ.setdefault(name, value)  # before crewai (and LiteLLM) are imported: they read them at import

from crewai import LLM, Agent  # noqa: E402

llm = LLM(
    model="openai/" + os.environ.get("AGL_MODEL", "tiny"),
    base_url=os.environ["OPENAI_BASE_URL"],
    api_key=os.environ["OPENAI_API_KEY"],
)
agent = Agent(role="Assistant", goal="Answer the user briefly.", backstory="You are helpful.", llm=llm)
messages: list[dict[str, str]] = []
for turn in json.loads(os.environ.get("AGL_TASK", "{}")).get("turns", ["Say hello."]):
    messages.append({"role": "user", "content": turn})
    reply = agent.kickoff(messages).raw
    print(reply)
    messages.append({"role": "assistant", "content": reply})
