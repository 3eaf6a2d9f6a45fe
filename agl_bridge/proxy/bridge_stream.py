"""What the Responses and Anthropic wire writers share: compact JSON, and turning the items of
`ChatService.stream` into a protocol's stream events.

A stream's opening events are known once the prompt is encoded, but are written together with the
first event that carries output: a client then wakes once for its first token (as for a chat
completion's first chunk). Only the first choice is streamed (the bridge routes serve one).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from agl_bridge.chat import PromptEncoding
from agl_bridge.proxy.request import ChatResult
from agl_bridge.proxy.streaming import StreamDelta


def compact_json(document: Mapping[str, Any]) -> str:
    """`document` as JSON without spaces, non-ASCII text kept as it is (the wire form of both protocols)."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"))


class BridgeStreamWriter(ABC):
    """Writes one streamed request's events; a protocol says what opens, continues and closes its stream."""

    def __init__(self) -> None:
        self._opening = ""

    def events(self, item: PromptEncoding | StreamDelta | ChatResult) -> bytes:
        """The stream events one item of `ChatService.stream` becomes (empty bytes: none to write yet)."""
        if isinstance(item, PromptEncoding):
            self._opening = self._opening_events(item)
            return b""
        if isinstance(item, StreamDelta):
            return self._written(self._text_delta(item.text)) if item.index == 0 and item.text else b""
        return self._written(self._closing(item))

    def _written(self, events: str) -> bytes:
        data, self._opening = self._opening + events, ""
        return data.encode()

    @abstractmethod
    def _opening_events(self, encoding: PromptEncoding) -> str:
        """The events that open the stream, once the prompt is encoded."""

    @abstractmethod
    def _text_delta(self, text: str) -> str:
        """The events for the next piece of the answer's text."""

    @abstractmethod
    def _closing(self, result: ChatResult) -> str:
        """The events that end the stream, from the whole result."""
