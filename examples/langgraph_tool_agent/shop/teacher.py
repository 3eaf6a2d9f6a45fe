"""The careless scripted player whose episodes are the warm-start data, played through the real agent.

`CarelessTeacher` knows the task but not the delivery fee. At each decision it takes the careful step (look
the price up; ask `order_total` with the price it read) unless, with probability `shortcut_rate`, it cuts a
corner: it answers a guessed total at once, calls `order_total` with a guessed price, or skips `order_total`
and answers a guessed total. After `order_total` it answers with the till's sentence ("The total is 31."); a
guessed total (quantity × a guessed price + a guessed fee) is said the same way. Its episodes are right when it was
careful, and now and then by luck: the logs of a careless agent.

Its episodes are played by the unchanged agent (`shop.agent.play`): its `ChatOpenAI` talks to the teacher
through an in-memory HTTP transport instead of a server. Each request LangGraph sends is recorded as it was
sent — system prompt, user message, earlier tool calls and tool results, and the tool definitions — and the
teacher's reply to it, written as the chat template renders that assistant message, is the response to
train on. So the warm start sees exactly the prompts the agent sends during RL.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from shop.outcome import Outcome
from shop.tasks import FEES, PRICES
from shop.tools import total_sentence

WarmStartPair = tuple[dict[str, Any], str]
"""({"messages": [...], "tools": [...]} as the agent sent them, the reply's text as the chat template writes it)."""


class CarelessTeacher:
    """One episode's scripted player: `reply(messages)` is its answer (an OpenAI assistant message) to a request."""

    def __init__(self, task: dict[str, Any], rng: random.Random, shortcut_rate: float) -> None:
        if not 0.0 <= shortcut_rate <= 1.0:
            raise ValueError(f"shortcut_rate must be between 0 and 1, got {shortcut_rate}")
        self.task = task
        self.rng = rng
        self.shortcut_rate = shortcut_rate
        self._ids = itertools.count(1)

    def reply(self, messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The next assistant message, from what the conversation so far shows."""
        quantity = int(self.task["quantity"])
        called = [
            c["function"]["name"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []
        ]
        last = messages[-1]
        if last["role"] == "tool" and called and called[-1] == "order_total":
            return self._answer(str(last["content"]))
        if last["role"] == "tool" and called and called[-1] == "lookup_price":
            if self._careful():
                return self._call("order_total", quantity=quantity, price=json.loads(last["content"])["price"])
            return self._answer(self._guessed_total())
        if self._careful():
            return self._call("lookup_price", item=self.task["item"])
        if self.rng.random() < 0.5:
            return self._answer(self._guessed_total())
        return self._call("order_total", quantity=quantity, price=self._guess(PRICES))

    def _careful(self) -> bool:
        return self.rng.random() >= self.shortcut_rate

    def _guess(self, values: Sequence[int]) -> int:
        return self.rng.choice(values)

    def _guessed_total(self) -> str:
        """A corner cut: the total said for a guessed price and a guessed fee."""
        return total_sentence(int(self.task["quantity"]) * self._guess(PRICES) + self._guess(FEES))

    def _answer(self, text: str) -> dict[str, Any]:
        return {"role": "assistant", "content": text}

    def _call(self, name: str, **arguments: Any) -> dict[str, Any]:
        # The arguments' JSON as the proxy's parser writes a sampled call's (json.dumps' separators), so the
        # template renders a call the student samples and one the teacher wrote the same way.
        call = {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": f"call_{next(self._ids)}", "type": "function", "function": call}],
        }


class Player(Protocol):
    """Whatever answers the agent's requests in place of a model: `CarelessTeacher`, or a test's script."""

    def reply(self, messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The assistant message answering a request whose messages are `messages`."""
        ...


@dataclass
class TeacherTransport:
    """An in-memory OpenAI chat-completions server answered by `player`; `requests` logs each request body and
    the reply to it."""

    player: Player
    requests: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        """Answer one chat completion request."""
        body = json.loads(request.content)
        message = self.player.reply(body["messages"])
        self.requests.append((body, message))
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return httpx.Response(
            200,
            json={
                "id": f"chatcmpl-teacher-{len(self.requests)}",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "teacher"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            },
        )


@dataclass(frozen=True)
class TeacherEndpoint:
    """Where the agent's ChatOpenAI thinks the teacher is (nothing listens: the transport answers)."""

    base_url: str = "http://teacher.invalid/v1"
    api_key: str = "teacher"
    model: str = "teacher"


def reply_text(codec: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]], reply: dict[str, Any]) -> str:
    """The text the chat template writes for assistant message `reply` after `messages` (with `tools`), without
    the end-of-turn marker: what the model samples to produce that message."""
    prompt = codec.render(messages, tools)
    turn = codec.render([*messages, reply], tools, add_generation_prompt=False)
    if not turn.startswith(prompt):
        raise ValueError("the chat template does not render the reply after the prompt it answers")
    text = turn[len(prompt) :]
    marker = codec.tokenizer.decode([codec.stop_token_ids[0]])
    end = text.rfind(marker)
    if end < 0:
        raise ValueError(f"the chat template closes the reply without {marker!r}")
    return text[:end]


def play_with(
    player: Player, task: dict[str, Any]
) -> tuple[Outcome, list[Any], list[tuple[dict[str, Any], dict[str, Any]]]]:
    """One episode of the real agent on `task` with `player` answering its model calls in memory: the outcome,
    the conversation, and every request body the agent sent with the reply it got."""
    from shop.agent import chat_model, play

    transport = TeacherTransport(player)
    with httpx.Client(transport=httpx.MockTransport(transport)) as client:
        outcome, messages = play(task, chat_model(TeacherEndpoint(), http_client=client))
    return outcome, messages, transport.requests


def teacher_episode(
    task: dict[str, Any], rng: random.Random, shortcut_rate: float, codec: Any
) -> tuple[list[WarmStartPair], Outcome]:
    """One episode of the teacher through the real agent: a warm-start pair per model call, and the outcome."""
    outcome, _, requests = play_with(CarelessTeacher(task, rng, shortcut_rate), task)
    pairs = []
    for body, reply in requests:
        prompt = {"messages": body["messages"], "tools": body["tools"]}
        pairs.append((prompt, reply_text(codec, body["messages"], body["tools"], reply)))
    return pairs, outcome


def warm_start_episodes(
    tasks: Sequence[dict[str, Any]], seed: int, shortcut_rate: float, tokenizer: Any
) -> tuple[list[WarmStartPair], list[Outcome]]:
    """The teacher's episodes on `tasks`: the warm-start pairs of every model call of every episode (right or
    wrong: all of a careless agent's logs), and each episode's outcome."""
    from agl_bridge.chat import ChatCodec

    codec = ChatCodec(tokenizer)
    rng = random.Random(seed)
    pairs: list[WarmStartPair] = []
    outcomes = []
    for task in tasks:
        episode, outcome = teacher_episode(task, rng, shortcut_rate, codec)
        pairs += episode
        outcomes.append(outcome)
    return pairs, outcomes
