"""Helpers for the LangGraph shop agent's tests: the example on the import path, scripted replies."""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "langgraph_tool_agent"
if str(EXAMPLE) not in sys.path:
    sys.path.insert(0, str(EXAMPLE))

_IDS = itertools.count(1)


def answer(text: str) -> dict[str, Any]:
    """An assistant message that answers with `text`."""
    return {"role": "assistant", "content": text}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """An assistant message calling tool `name` with `arguments`."""
    function = {"name": name, "arguments": json.dumps(arguments)}
    tool_call = {"id": f"call_{next(_IDS)}", "type": "function", "function": function}
    return {"role": "assistant", "content": None, "tool_calls": [tool_call]}


class Script:
    """A player that replies with `replies` in order (the last one again once they run out)."""

    def __init__(self, replies: Sequence[dict[str, Any]]) -> None:
        self.replies = list(replies)
        self.calls = 0

    def reply(self, messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The next scripted reply."""
        self.calls += 1
        return self.replies[min(self.calls, len(self.replies)) - 1]


def prompt_and_response(datum: Any) -> tuple[list[int], list[int]]:
    """A warm-start datum's prompt ids (not trained) and response ids (trained), as one sequence splits."""
    tokens = [*datum.model_input, datum.loss_fn_inputs["target_tokens"][-1]]
    trained = [0.0, *datum.loss_fn_inputs["weights"]]
    first = next(i for i, weight in enumerate(trained) if weight)
    return tokens[:first], tokens[first:]
