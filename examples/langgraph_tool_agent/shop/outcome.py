"""What an episode earned and why, and when a model turn's tool call is well-formed.

Every episode ends with an `Outcome`: a reward (1 if the final answer states the right total, else 0) and
the reason, one of `REASONS`:
  - "correct": the last number of the final answer is the total;
  - "wrong total" / "no total": the answer names another number, or none;
  - "malformed tool call": the model wrote `<tool_call>` text that did not parse (the proxy leaves it in the
    answer's content, so LangGraph sees a plain answer and ends), or a call LangChain could not read;
  - "turn limit": the episode ran past `MAX_TURNS` model calls (LangGraph's recursion limit).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agl_bridge.chat.tool_calls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, parse_tool_calls
from shop.tasks import total
from shop.tools import tool_signatures

REASONS = ("correct", "wrong total", "no total", "malformed tool call", "turn limit")

_NUMBER = re.compile(r"-?\d+")
_JSON_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "number": (int, float)}


@dataclass(frozen=True)
class Outcome:
    """An episode's reward, its reason (one of `REASONS`), a sentence saying more, and the tools it called."""

    reward: float
    reason: str
    detail: str
    tool_calls: tuple[str, ...] = ()

    def attributes(self) -> dict[str, Any]:
        """The outcome as span attributes."""
        return {
            "shop.reward": self.reward,
            "shop.reason": self.reason,
            "shop.detail": self.detail,
            "shop.tool_calls": list(self.tool_calls),
        }


def stated_total(text: str) -> int | None:
    """The number an answer states: its last integer (None when it has none)."""
    numbers = _NUMBER.findall(text)
    return int(numbers[-1]) if numbers else None


def outcome_of(task: dict[str, Any], messages: Sequence[Any], *, turn_limit: bool = False) -> Outcome:
    """The outcome of an episode on `task` whose conversation (LangChain messages) is `messages`.

    turn_limit: the episode was stopped at its turn limit, whatever its last message says.
    """
    calls = tuple(call["name"] for m in messages if m.type == "ai" for call in m.tool_calls)
    expected = total(task)
    if turn_limit:
        return Outcome(0.0, "turn limit", f"no answer within the turn limit ({len(calls)} tool calls)", calls)
    last = messages[-1] if messages else None
    if last is None or last.type != "ai":
        return Outcome(0.0, "no total", "the episode ended without an answer", calls)
    answer = str(last.text)
    invalid = getattr(last, "invalid_tool_calls", None)
    if invalid:
        detail = (
            f"LangChain could not read the call of {invalid[0].get('name')!r}: {str(invalid[0].get('args'))[:120]!r}"
        )
        return Outcome(0.0, "malformed tool call", detail, calls)
    if TOOL_CALL_OPEN in answer or TOOL_CALL_CLOSE in answer:
        return Outcome(0.0, "malformed tool call", f"tool-call text that did not parse: {answer[:120]!r}", calls)
    stated = stated_total(answer)
    if stated is None:
        return Outcome(0.0, "no total", f"the answer states no number: {answer[:120]!r}", calls)
    if stated != expected:
        return Outcome(0.0, "wrong total", f"answered {stated}, the total is {expected}", calls)
    return Outcome(1.0, "correct", f"answered {stated}", calls)


def well_formed(text: str) -> bool:
    """Whether one model turn's text is well-formed: a plain answer without any tool-call markup, or tool calls
    whose every `<tool_call>` block is a JSON object naming a known tool with exactly its arguments, each of
    its type."""
    if TOOL_CALL_OPEN not in text and TOOL_CALL_CLOSE not in text:
        return True
    parsed = parse_tool_calls(text)
    if parsed.errors or not parsed.tool_calls or text.count(TOOL_CALL_OPEN) != len(parsed.tool_calls):
        return False
    signatures = tool_signatures()
    for call in parsed.tool_calls:
        signature = signatures.get(call.function.name)
        try:
            arguments = json.loads(call.function.arguments)
        except ValueError:
            return False
        if signature is None or not isinstance(arguments, dict) or set(arguments) != set(signature):
            return False
        for name, kind in signature.items():
            value = arguments[name]
            if isinstance(value, bool) or not isinstance(value, _JSON_TYPES.get(kind, ())):
                return False
    return True
