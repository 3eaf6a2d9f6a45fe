"""Agent sources the tests and benchmarks write into a run's folder (`agent = "path/agent.py:agent"`)."""

from __future__ import annotations

VARIED_REWARD_HELLO_AGENT = """
from agl_bridge import emit_reward


def agent(task, endpoint):
    client = endpoint.openai_client()
    reply = client.chat.completions.create(
        model=endpoint.model, messages=[{"role": "user", "content": f"Let's play a game. Say you are {task}."}],
    )
    text = reply.choices[0].message.content or ""
    emit_reward(len(set(text)) / max(1, len(text)))
"""
"""The hello agent's shape (plain OpenAI SDK + `emit_reward`) with a reward that varies on the random tiny
model (the share of distinct characters), so every group has an advantage to train on: the hello game's
own reward is 0 until a warm start."""
