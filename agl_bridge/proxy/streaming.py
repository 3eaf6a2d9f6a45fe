"""Turning one choice's tokens, as they are sampled, into safe text deltas for an SSE stream.

A delta is sent only when no later token can change it: text that might become a stop string, the
end-of-turn marker or a `<tool_call>` block is held back until it is certain. Nothing after a stop
string or a tool-call opener is streamed as content; the final message (parsed from all the ids)
supplies the rest. So the deltas joined equal the final message's content, which equals the text
decoded from the sampled ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agl_bridge.chat import AssistantMessage, ChatCodec
from agl_bridge.chat.tool_calls import TOOL_CALL_OPEN
from agl_bridge.sampler.base import TokenEvent


@dataclass
class StreamDelta:
    """New content of one choice plus the token ids (and their logprobs) sampled since the last delta."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[float]

    def extended(self, after: StreamDelta | FinalPiece) -> StreamDelta:
        """This delta followed by `after` (text, ids and logprobs joined), for content sent later in one piece."""
        return StreamDelta(
            self.index, self.text + after.text, self.token_ids + after.token_ids, self.logprobs + after.logprobs
        )


@dataclass
class FinalPiece:
    """What is left to send for a choice once sampling ended: text, ids, and the final message."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    message: AssistantMessage


@dataclass
class ChoiceStreamer:
    """Accumulates one choice's tokens and hands out the text that is safe to send."""

    codec: ChatCodec
    stop_strings: Sequence[str]
    parse_tool_calls: bool
    _ids: list[int] = field(default_factory=list)
    _logprobs: list[float] = field(default_factory=list)
    _text: str = ""
    _sent: int = 0
    _message: AssistantMessage | None = None

    def __post_init__(self) -> None:
        self._decoder = self.codec.incremental_decoder()
        markers = [*self.stop_strings, *self.codec.stop_token_texts]
        if self.parse_tool_calls:
            markers.append(TOOL_CALL_OPEN)
        self._markers = tuple(m for m in markers if m)

    def push(self, event: TokenEvent) -> tuple[str, list[int], list[float]] | None:
        """Take one sampled token; return (text, ids, logprobs) to send now, or None to wait."""
        self._ids.append(event.token)
        self._logprobs.append(event.logprob)
        self._text += self._decoder.push(event.token)
        safe = self._safe_length()
        if safe <= self._sent:
            return None
        text, self._sent = self._text[self._sent : safe], safe
        ids, logprobs = self._ids, self._logprobs
        self._ids, self._logprobs = [], []
        return text, ids, logprobs

    def finish(self, message: AssistantMessage) -> None:
        """Record the final message parsed from all of this choice's ids."""
        self._message = message

    def final_piece(self) -> FinalPiece:
        """The content not sent yet, the ids not reported yet, and the final message."""
        assert self._message is not None, "finish() must be called first"
        content = self._message.content or ""
        sent = self._text[: self._sent]
        # The held-back text always ends where the final content does, so this is the exact rest.
        rest = content[len(sent) :] if content.startswith(sent) else ""
        return FinalPiece(rest, self._ids, self._logprobs, self._message)

    def _safe_length(self) -> int:
        text = self._text
        limit = len(text)
        for marker in self._markers:
            found = text.find(marker)
            if found >= 0:
                limit = min(limit, found)
        held = 0
        for marker in self._markers:
            for size in range(min(len(marker) - 1, limit), 0, -1):
                if text[:limit].endswith(marker[:size]):
                    held = max(held, size)
                    break
        limit -= held
        if self.parse_tool_calls and text[:limit].endswith("\n"):
            limit -= 1  # the newline before a tool call is not content
        return limit
