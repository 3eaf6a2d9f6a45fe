"""LangChain/LangGraph through agl-bridge: `ChatOpenAI` pointed at the proxy, driving LangChain's
`create_agent` (a LangGraph ReAct loop) with a checkpointer, so each turn continues the thread.

Run it as an `AgentCommand`: `OPENAI_BASE_URL` (routed to the rollout attempt), `OPENAI_API_KEY`,
`AGL_MODEL`, and `AGL_TASK` whose `turns` are the user messages of one conversation.
`--reasoning-effort LEVEL` sends OpenAI's `reasoning_effort` with every call.
"""

from __future__ import annotations

import argparse
import json
import os

from langchain.agents import create_agent
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--reasoning-effort", choices=["minimal", "low", "medium", "high"])
llm = ChatOpenAI(
    model=os.environ.get("AGL_MODEL", "tiny"),
    base_url=os.environ["OPENAI_BASE_URL"],
    api_key=os.environ["OPENAI_API_KEY"],
    reasoning_effort=parser.parse_args().reasoning_effort,
)
agent = create_agent(llm, tools=[add], system_prompt="Be brief.", checkpointer=InMemorySaver())
thread = {"configurable": {"thread_id": "conversation"}}
for turn in json.loads(os.environ.get("AGL_TASK", "{}")).get("turns", ["Say hello."]):
    state = agent.invoke({"messages": [{"role": "user", "content": turn}]}, thread)
    print(state["messages"][-1].content)
