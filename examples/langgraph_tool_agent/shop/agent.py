"""The shop agent: LangChain's `create_agent` (a LangGraph ReAct loop) with two tools, written the ordinary way.

An episode: the user sends an order ticket (an item and a quantity) and asks what it costs; the model looks
the price up, asks the till for the order's total (`order_total`, which adds a delivery fee only it knows),
and answers with the till's sentence ("The total is 31."). The only
agl_bridge-specific lines are where the model is (`endpoint.base_url` and the rollout's key) and the reward
at the end (`emit_reward`); the outcome's reason goes into the rollout as a span (`telemetry.py`). `play` is
the episode without either, for any OpenAI-compatible model.

Bad input never crashes an episode; it ends it with a reason (`outcome.py`):
  - a tool call that does not parse stays in the reply's text (the proxy's parser), so LangGraph sees a plain
    answer and stops: "malformed tool call";
  - a tool that raises (an unknown item): LangChain's `ToolErrorMiddleware` returns the error to the model as
    the tool's message, and the episode goes on; an unknown tool or bad arguments are answered the same way
    by LangGraph's `ToolNode` itself;
  - more than `MAX_TURNS` model calls: LangGraph's recursion limit stops the graph: "turn limit".
"""

from __future__ import annotations

from typing import Any

import httpx
from langchain.agents import create_agent
from langchain.agents.middleware import ToolErrorMiddleware
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError

from shop.outcome import Outcome, outcome_of
from shop.tasks import user_message
from shop.tools import shop_tools

SYSTEM_PROMPT = "You work at a shop's till. Look up the price, get the order total, then tell the customer the total."

MAX_TURNS = 5
"""Model calls an episode may make; a full episode makes 3 (look up, order total, answer)."""

# LangGraph counts a step per node run: a model call, or the tool node running its calls. Model call k is step
# 2k - 1, so at this limit the MAX_TURNS-th call may still answer; if it calls a tool instead, the tool runs
# (step 2 * MAX_TURNS) and the graph raises GraphRecursionError before another model call (measured).
RECURSION_LIMIT = 2 * MAX_TURNS

# The longest reply the task needs is an order_total call: 33 tokens of the tiny model's tokenizer
# ('<tool_call>\n{"name": "order_total", "arguments": {"quantity": 4, "price": 7}}\n</tool_call>') and the end of
# the turn; a lookup is 24 + 1, an answer ("The total is 31.") 8-9. 36 leaves a little room and cuts the random
# model's rambling short.
REPLY_MAX_TOKENS = 36

# One HTTP connection pool for every episode of the process: a ChatOpenAI without one builds its own client,
# whose TLS context costs ~75 ms of CPU (measured on 2 cores), more than an episode's HTTP.
_HTTP = httpx.Client(timeout=httpx.Timeout(300.0, connect=10.0))


def chat_model(endpoint: Any, *, http_client: httpx.Client | None = None) -> ChatOpenAI:
    """The agent's model: `ChatOpenAI` at `endpoint` (base_url, api_key, model), over the shared connection pool
    unless `http_client` is given."""
    return ChatOpenAI(
        model=endpoint.model,
        base_url=endpoint.base_url,
        api_key=endpoint.api_key,
        max_completion_tokens=REPLY_MAX_TOKENS,
        http_client=http_client or _HTTP,
    )


def tool_error_message(error: Exception, request: Any) -> str | None:
    """What the model is told when a tool raises ValueError (an unknown item); anything else propagates."""
    return f"Error: {error}" if isinstance(error, ValueError) else None


def build_agent(model: Any, task: dict[str, Any]) -> Any:
    """The LangGraph agent of one episode: the model, the task's tools, the system prompt."""
    return create_agent(
        model,
        tools=shop_tools(task["prices"], task["fee"]),
        system_prompt=SYSTEM_PROMPT,
        middleware=[ToolErrorMiddleware(tool_error_message)],
    )


def play(task: dict[str, Any], model: Any) -> tuple[Outcome, list[Any]]:
    """Run one episode on `task` with the chat model `model`: its outcome and its messages."""
    graph = build_agent(model, task)
    messages: list[Any] = []
    question = {"messages": [{"role": "user", "content": user_message(task)}]}
    try:
        for state in graph.stream(question, {"recursion_limit": RECURSION_LIMIT}, stream_mode="values"):
            messages = state["messages"]
    except GraphRecursionError:
        return outcome_of(task, messages, turn_limit=True), messages
    return outcome_of(task, messages), messages


def shop_agent(task: dict[str, Any], endpoint: Any) -> None:
    """The rollout: play one episode through `endpoint`, record its outcome, emit its reward."""
    from agl_bridge import emit_reward
    from shop.telemetry import episode_span

    with episode_span(endpoint) as span:
        outcome, _ = play(task, chat_model(endpoint))
        span.set_attributes(outcome.attributes())
        emit_reward(outcome.reward)
