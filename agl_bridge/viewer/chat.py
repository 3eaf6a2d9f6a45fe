"""Stored messages and responses → chat bubbles: role, text, tool calls, tool results.

Messages are what the agent sent (OpenAI chat format, as stored); a response is the sampled text,
split into content and `<tool_call>` blocks with the proxy's own parser, so the page shows the tool
calls the agent received.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agl_bridge.chat import parse_tool_calls


@dataclass(frozen=True, slots=True)
class ToolCallView:
    """One tool call: its name and arguments (pretty-printed when they are JSON)."""

    name: str
    arguments: str
    call_id: str | None = None


@dataclass(slots=True)
class ChatMessage:
    """One chat bubble."""

    role: str
    text: str | None
    tool_calls: list[ToolCallView] = field(default_factory=list)
    name: str | None = None
    tool_call_id: str | None = None
    notes: list[str] = field(default_factory=list)


def _pretty(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, indent=2, ensure_ascii=False)


def _content_text(content: Any, notes: list[str]) -> str | None:
    """Text of a message's `content` (a string, or a list of parts whose text parts are joined)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                notes.append(f"[{part.get('type', 'part') if isinstance(part, dict) else type(part).__name__}]")
        return "\n".join(texts)
    return json.dumps(content, ensure_ascii=False)


def chat_message(message: Any) -> ChatMessage:
    """A stored request message as a bubble (anything unexpected is shown as JSON, not dropped)."""
    if not isinstance(message, dict):
        return ChatMessage(role="?", text=json.dumps(message, ensure_ascii=False))
    notes: list[str] = []
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        calls.append(
            ToolCallView(
                name=str(function.get("name", "?")),
                arguments=_pretty(function.get("arguments", "")),
                call_id=call.get("id") if isinstance(call, dict) else None,
            )
        )
    return ChatMessage(
        role=str(message.get("role", "?")),
        text=_content_text(message.get("content"), notes),
        tool_calls=calls,
        name=message.get("name"),
        tool_call_id=message.get("tool_call_id"),
        notes=notes,
    )


def response_message(text: str | None) -> ChatMessage:
    """A sampled response as the assistant bubble the agent received (tool calls parsed out)."""
    if text is None:
        return ChatMessage(role="assistant", text=None, notes=["no response text was recorded"])
    parsed = parse_tool_calls(text)
    return ChatMessage(
        role="assistant",
        text=parsed.content,
        tool_calls=[
            ToolCallView(name=c.function.name, arguments=_pretty(c.function.arguments)) for c in parsed.tool_calls
        ],
        notes=[f"unparsed tool call: {error.reason}" for error in parsed.errors],
    )


def new_messages(previous: list[Any] | None, current: list[Any]) -> tuple[int, list[Any]]:
    """(how many leading messages `current` shares with `previous`, the rest): each turn shows only what is new."""
    if not previous:
        return 0, current
    shared = 0
    for before, now in zip(previous, current, strict=False):
        if before != now:
            break
        shared += 1
    return shared, current[shared:]
