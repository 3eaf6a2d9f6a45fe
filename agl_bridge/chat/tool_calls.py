"""Parse Hermes/Qwen-style `<tool_call>{"name": ..., "arguments": ...}</tool_call>` blocks from model text.

The parse is the inverse of what Qwen-style chat templates render for an assistant message with
`content` and `tool_calls`: content, a newline, then one block per call separated by newlines.
Keeping it an exact inverse matters: when the agent sends the parsed message back, the template
then re-renders the very text that was sampled, and the sampled token ids can be reused.

A block that is not a JSON object with a string "name" is never an error for the caller: it stays
in the content as text and is reported in `ParsedToolCalls.errors`.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


def new_tool_call_id() -> str:
    """A fresh OpenAI-style tool call id: `call_` and 24 hex digits."""
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True)
class FunctionCall:
    """The function part of a tool call; `arguments` is a JSON text, as in the OpenAI API."""

    name: str
    arguments: str


@dataclass(frozen=True)
class ToolCall:
    """One OpenAI-format tool call parsed from model output."""

    id: str
    function: FunctionCall
    type: str = "function"

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI `tool_calls[]` entry for this call."""
        return {
            "id": self.id,
            "type": self.type,
            "function": {"name": self.function.name, "arguments": self.function.arguments},
        }


@dataclass(frozen=True)
class ToolCallError:
    """A `<tool_call>` block that was left in the content as text, and why."""

    block_index: int
    text: str
    reason: str


@dataclass
class ParsedToolCalls:
    """Model text split into assistant `content` (None when empty and there are calls) and calls."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[ToolCallError] = field(default_factory=list)


def parse_tool_calls(
    text: str,
    *,
    open_tag: str = TOOL_CALL_OPEN,
    close_tag: str = TOOL_CALL_CLOSE,
    id_factory: Callable[[], str] = new_tool_call_id,
) -> ParsedToolCalls:
    """Split `text` into content and tool calls.

    Content is the text before the first valid block minus the one newline the template puts
    between content and the first call; whitespace between and after valid blocks is the
    template's separator and is dropped; other text outside valid blocks is appended to the
    content (on its own line) so nothing the model wrote is lost.
    """
    # chunks[k] collects the text between valid call k-1 and valid call k (invalid blocks included).
    chunks: list[list[str]] = [[]]
    calls: list[ToolCall] = []
    errors: list[ToolCallError] = []
    pos = 0
    block_index = 0
    while True:
        start = text.find(open_tag, pos)
        if start < 0:
            break
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            errors.append(ToolCallError(block_index, text[start:], f"unterminated {open_tag} block (no {close_tag})"))
            break
        block_end = end + len(close_tag)
        chunks[-1].append(text[pos:start])
        call, reason = _parse_block(text[start + len(open_tag) : end], id_factory)
        if call is not None:
            calls.append(call)
            chunks.append([])
        else:
            chunks[-1].append(text[start:block_end])
            errors.append(ToolCallError(block_index, text[start:block_end], reason))
        pos = block_end
        block_index += 1
    chunks[-1].append(text[pos:])

    if not calls:
        return ParsedToolCalls(content=text, tool_calls=[], errors=errors)
    lead = "".join(chunks[0])
    if lead.endswith("\n"):
        lead = lead[:-1]
    extra = [piece.strip() for piece in ("".join(c) for c in chunks[1:]) if piece.strip()]
    content = "\n".join(([lead] if lead else []) + extra)
    return ParsedToolCalls(content=content or None, tool_calls=calls, errors=errors)


def format_arguments(arguments: object) -> str:
    """OpenAI `arguments` text for parsed JSON arguments.

    Objects are dumped with json.dumps defaults (", " / ": " separators, non-ASCII kept), which is
    also what chat templates' `tojson` writes, so a model that used those separators gets back
    exactly the text it sampled.
    """
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False)


def _parse_block(inner: str, id_factory: Callable[[], str]) -> tuple[ToolCall | None, str]:
    """One block's JSON; (call, "") or (None, why it is not a call)."""
    try:
        payload = json.loads(inner)
    except ValueError as exc:
        return None, f"tool call is not valid JSON: {exc}"
    if not isinstance(payload, dict):
        return None, f"tool call must be a JSON object, got {type(payload).__name__}"
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return None, 'tool call JSON has no string "name"'
    arguments = payload.get("arguments", {})
    if not isinstance(arguments, (dict, str)):
        return None, f'tool call "arguments" must be a JSON object, got {type(arguments).__name__}'
    return ToolCall(id=id_factory(), function=FunctionCall(name=name, arguments=format_arguments(arguments))), ""
