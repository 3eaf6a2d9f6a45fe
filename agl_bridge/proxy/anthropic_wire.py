"""Anthropic's Messages API wire format for our chat results: the message and its stream events.

`AnthropicWriter` writes one served request's answer — the whole `message`, or the stream's
events (`message_start`, `content_block_start` / `_delta` / `_stop`, `message_delta`,
`message_stop`) as the items of `ChatService.stream` arrive — as JSON documents in the shapes of
Anthropic's API reference (LiteLLM's typed dicts in `litellm.types.llms.anthropic` describe the same;
the `anthropic` SDK is not a dependency). They are written as plain dicts: LiteLLM's adapter, which
wrote them before, first needed our result as its chat objects and then translated them, which cost
more CPU than the rest of a request's answer.

What it reports that LiteLLM's adapter left out: `stop_reason: "stop_sequence"` with the
`stop_sequence` that ended the text (one of the request's `stop_sequences`), the prompt's length in
`message_start`'s usage (known when the stream opens: the prompt is encoded before sampling), and
the same `msg_…` id streamed or not.

The answer comes from the first choice (the route serves one). Its text is a `text` block, present
whenever the chat message has content (possibly empty); each tool call is a `tool_use` block after
it, its `input` the parsed arguments (the raw text when they are not JSON), its name the one the
client gave (LiteLLM's request translation shortens names longer than OpenAI's 64 characters;
`tool_names` maps them back). A stream's `message_start` is written together with its first event
that carries output, so a client wakes once for its first token.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agl_bridge.chat import AssistantMessage, PromptEncoding, ToolCall
from agl_bridge.proxy.bridge_stream import BridgeStreamWriter, compact_json
from agl_bridge.proxy.request import ChatResult

_STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}
"""Anthropic's `stop_reason` for a chat `finish_reason` (any other: "end_turn")."""


def stop_of(message: AssistantMessage) -> dict[str, Any]:
    """`stop_reason` and `stop_sequence` of a finished message."""
    if message.stop_string is not None:
        return {"stop_reason": "stop_sequence", "stop_sequence": message.stop_string}
    return {"stop_reason": _STOP_REASONS.get(message.finish_reason, "end_turn"), "stop_sequence": None}


def tool_input(arguments: str) -> Any:
    """A tool call's `input`: its JSON arguments parsed ({} for none), or the text itself when it is not JSON."""
    if not arguments.strip():
        return {}
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


class AnthropicWriter(BridgeStreamWriter):
    """Writes the answer to one Anthropic Messages request: the whole message (`answer`) or its stream (`events`)."""

    def __init__(self, message_id: str, model: str, tool_names: Mapping[str, str]) -> None:
        super().__init__()
        self._id = message_id
        self._model = model
        self._tool_names = tool_names
        self._blocks = 0
        """Content blocks started so far in the stream (the next one's index)."""
        self._prompt_tokens = 0

    def message(self, result: ChatResult) -> dict[str, Any]:
        """The `message` object answering the request."""
        message = result.choices[0].message
        content: list[dict[str, Any]] = [] if message.content is None else [{"type": "text", "text": message.content}]
        content += [self._tool_use(call, tool_input(call.function.arguments)) for call in message.tool_calls]
        return {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": content,
            **stop_of(message),
            "usage": {"input_tokens": len(result.prompt_token_ids), "output_tokens": result.completion_tokens},
        }

    def answer(self, result: ChatResult) -> bytes:
        """The whole message answering a non-streamed request, as JSON."""
        return compact_json(self.message(result)).encode()

    def _opening_events(self, encoding: PromptEncoding) -> str:
        self._prompt_tokens = len(encoding.token_ids)
        usage = {
            "input_tokens": self._prompt_tokens,
            "output_tokens": 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        start = {"id": self._id, "type": "message", "role": "assistant", "model": self._model, "content": []}
        return _event("message_start", message={**start, "stop_reason": None, "stop_sequence": None, "usage": usage})

    def _text_delta(self, text: str) -> str:
        opened = "" if self._blocks else self._open_text()
        return opened + _event("content_block_delta", index=0, delta={"type": "text_delta", "text": text})

    def _open_text(self) -> str:
        self._blocks = 1
        return _event("content_block_start", index=0, content_block={"type": "text", "text": ""})

    def _closing(self, result: ChatResult) -> str:
        """The rest of the stream: the last text, the tool calls, the stop reason and usage."""
        message = result.choices[0].message
        rest = result.final_pieces[0].text if result.final_pieces else ""
        events = [self._text_delta(rest) if rest else ""]
        if message.content is not None and not self._blocks:
            events.append(self._open_text())
        if self._blocks:
            events.append(_event("content_block_stop", index=0))
        for call in message.tool_calls:
            index, self._blocks = self._blocks, self._blocks + 1
            events.append(_event("content_block_start", index=index, content_block=self._tool_use(call, {})))
            delta = {"type": "input_json_delta", "partial_json": call.function.arguments}
            events.append(_event("content_block_delta", index=index, delta=delta))
            events.append(_event("content_block_stop", index=index))
        usage = {"input_tokens": self._prompt_tokens, "output_tokens": result.completion_tokens}
        events.append(_event("message_delta", delta=stop_of(message), usage=usage))
        events.append(_event("message_stop"))
        return "".join(events)

    def _tool_use(self, call: ToolCall, given: Any) -> dict[str, Any]:
        name = self._tool_names.get(call.function.name, call.function.name)
        return {"type": "tool_use", "id": call.id, "name": name, "input": given}


def _event(kind: str, **fields: Any) -> str:
    return f"event: {kind}\ndata: {compact_json({'type': kind, **fields})}\n\n"
