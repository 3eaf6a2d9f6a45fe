"""OpenAI chat messages <-> exact token ids: validation, prompt encoding, response decoding.

`ChatCodec` renders prompts through the tokenizer's chat template and turns sampled ids back into
OpenAI assistant messages; a per-rollout `TokenCache` (from a `TokenCacheRegistry`) makes each
prompt extend the previous prompt + sampled response token for token.
"""

from __future__ import annotations

from agl_bridge.chat.codec import (
    AssistantMessage,
    ChatCodec,
    IncrementalDecoder,
    PrefixBreak,
    PromptEncoding,
    PromptTooLongError,
    ReusedSpan,
)
from agl_bridge.chat.messages import ALLOWED_ROLES, ChatFormatError, normalize_messages, normalize_tools
from agl_bridge.chat.text_bound import TextBound, text_bound
from agl_bridge.chat.token_cache import CachedResponse, TokenCache, TokenCacheRegistry
from agl_bridge.chat.tool_calls import FunctionCall, ToolCall, ToolCallError, parse_tool_calls

__all__ = [
    "ALLOWED_ROLES",
    "AssistantMessage",
    "CachedResponse",
    "ChatCodec",
    "ChatFormatError",
    "FunctionCall",
    "IncrementalDecoder",
    "PrefixBreak",
    "PromptEncoding",
    "PromptTooLongError",
    "ReusedSpan",
    "TextBound",
    "TokenCache",
    "TokenCacheRegistry",
    "ToolCall",
    "ToolCallError",
    "normalize_messages",
    "normalize_tools",
    "parse_tool_calls",
    "text_bound",
]
