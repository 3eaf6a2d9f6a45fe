"""Every work-around for a LiteLLM (1.106.2) bug or gap, in this one module.

The proxy app: LiteLLM iterates `tools` and `functions` before any validation — its auth layer for the tool
allow-list, its logging for built-in tool cost tracking — so a body with `"tools": 1` or
`"tools": true` raises TypeError there and the client gets a 500. Such a body is a client error:
with those two places made tolerant, the request reaches our own check, which answers 400 naming
`tools`.

FastAPI resolves the routes of LiteLLM's large app lazily, on the first request that reaches it
(`resolve_routes`).

The protocol translations the front door calls (`bridge_route`): they crash on some malformed
bodies (`translation_refused`), leave out Anthropic's stop sequence and prompt length
(`anthropic_message_fixed`, `anthropic_event_fixed`), and the Responses streaming iterator takes
a whole `CustomStreamWrapper` where it needs a chunk stream (`ChunkSource`) and reads the first chunk
before its opening events only to learn the response id (`responses_stream_with_id`).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from agl_bridge.proxy.litellm_wire import StreamedCall
from agl_bridge.proxy.request import RequestError

if TYPE_CHECKING:
    from litellm import CustomStreamWrapper
    from litellm.responses.litellm_completion_transformation.streaming_iterator import (
        LiteLLMCompletionStreamingIterator,
    )
    from litellm.types.utils import ModelResponseStream

_PATCHED_MODULES = (
    "litellm.proxy.auth.auth_checks",
    "litellm.proxy.guardrails.guardrail_hooks.tool_policy.tool_policy_guardrail",
)


def patch_litellm() -> None:
    """Apply the work-arounds (idempotent)."""
    import importlib

    from litellm.proxy.guardrails import tool_name_extraction

    original = tool_name_extraction.extract_request_tool_names
    if getattr(original, "_agl_patched", False):
        return

    @functools.wraps(original)
    def tolerant(route: Any, data: Any) -> list[str]:
        if isinstance(data, dict) and any(
            data.get(key) and not isinstance(data.get(key), list) for key in ("tools", "functions")
        ):
            return []  # malformed: left for the request validation to refuse with a 400
        return original(route, data)

    tolerant._agl_patched = True  # type: ignore[attr-defined]
    _patch_built_in_tools_params()
    tool_name_extraction.extract_request_tool_names = tolerant
    for name in _PATCHED_MODULES:
        module = importlib.import_module(name)
        if getattr(module, "extract_request_tool_names", None) is original:
            # Monkeypatching the name each module imported: ModuleType declares no such attribute.
            module.extract_request_tool_names = tolerant  # type: ignore[attr-defined]


def _patch_built_in_tools_params() -> None:
    from litellm.litellm_core_utils.litellm_logging import Logging
    from litellm.types.utils import StandardBuiltInToolsParams

    original = Logging.initialize_standard_built_in_tools_params

    @functools.wraps(original)
    def tolerant(self: Any, kwargs: dict | None = None) -> Any:
        try:
            return original(self, kwargs)
        except (TypeError, AttributeError):  # malformed tools: nothing to track, refused later with a 400
            return StandardBuiltInToolsParams(web_search_options=None, file_search=None)

    Logging.initialize_standard_built_in_tools_params = tolerant  # type: ignore[method-assign]


# ------------------------------------------------------------------ LiteLLM's protocol translations (bridge_route)


@contextmanager
def translation_refused(protocol: str) -> Iterator[None]:
    """Turn a LiteLLM translation's crash on a body it cannot take into a 400 (`RequestError`).

    LiteLLM's translators trust the body's shape; `bridge_checks` refuses the malformed shapes known
    to crash them, naming the field, and this catches the rest.
    """
    from pydantic import ValidationError

    try:
        yield
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, ValidationError) as error:
        message = f"the {protocol} request could not be translated to a chat request: {error}"
        raise RequestError(message[:500], code="invalid_value") from None


def anthropic_message_fixed(message: dict[str, Any], stop_sequence: str | None) -> dict[str, Any]:
    """LiteLLM's Anthropic message, with the `stop_reason` / `stop_sequence` it leaves out.

    Its adapter always answers `stop_reason: "end_turn"` and `stop_sequence: null`, even when one
    of the request's `stop_sequences` ended the text (Anthropic: `"stop_sequence"` and the string).
    """
    _set_stop(message, stop_sequence)
    return message


def anthropic_event_fixed(event: dict[str, Any], call: StreamedCall) -> dict[str, Any]:
    """An event of LiteLLM's Anthropic stream, with what it leaves out: the prompt's length in
    `message_start` (it writes 0: its wrapper starts before the prompt is known) and the stop sequence
    in `message_delta` (see `anthropic_message_fixed`)."""
    kind = event.get("type")
    if kind == "message_start" and call.prompt_tokens is not None:
        usage = (event.get("message") or {}).get("usage")
        if isinstance(usage, dict) and not usage.get("input_tokens"):
            usage["input_tokens"] = call.prompt_tokens
    elif kind == "message_delta" and isinstance(event.get("delta"), dict) and call.result is not None:
        choices = call.result.choices
        _set_stop(event["delta"], choices[0].message.stop_string if choices else None)
    return event


def _set_stop(fields: dict[str, Any], stop_sequence: str | None) -> None:
    if stop_sequence is not None and fields.get("stop_reason") == "end_turn":
        fields["stop_reason"] = "stop_sequence"
        fields["stop_sequence"] = stop_sequence


class ChunkSource:
    """Our chunk stream in the place of the `CustomStreamWrapper` LiteLLM's Responses streaming iterator takes.

    `LiteLLMCompletionStreamingIterator` reads only the wrapper's `__anext__` and its `logging_obj`
    (for LiteLLM's cost logging; None here: the proxy records calls itself).
    """

    logging_obj = None

    def __init__(self, chunks: AsyncIterator[ModelResponseStream]) -> None:
        self._chunks = chunks

    @classmethod
    def of(cls, chunks: AsyncIterator[ModelResponseStream]) -> CustomStreamWrapper:
        """A source typed as the wrapper the iterator expects."""
        return cast("CustomStreamWrapper", cls(chunks))

    def __aiter__(self) -> ChunkSource:
        return self

    async def __anext__(self) -> ModelResponseStream:
        return await anext(self._chunks)


def responses_stream_with_id(
    events: LiteLLMCompletionStreamingIterator, response_id: str
) -> LiteLLMCompletionStreamingIterator:
    """LiteLLM's Responses stream iterator, told the response's id before its first chunk.

    It reads the first chunk before its opening events (`response.created`, `response.in_progress`)
    only to learn the id they carry; the front door knows it beforehand, so the opening events are
    made before the first token is sampled, not between it and its write.
    """
    events._cached_response_id = response_id
    events._response_id_primed = True
    return events


def resolve_routes(app: Any) -> None:
    """Have FastAPI resolve the routes of LiteLLM's app now (the server calls it before it reports ready).

    FastAPI (0.16x) resolves an app's included routers lazily, on the first request that reaches
    them; for LiteLLM's hundreds of routes that takes about 1 s of CPU (3 s on a busy machine), which
    the first request LiteLLM serves would wait for (a client's `GET /v1/models`, say). Matching a
    path no route has resolves them all.
    """
    probe = {"type": "http", "path": "/agl-bridge/resolve-routes", "method": "GET", "headers": [], "root_path": ""}
    for route in app.router.routes:
        route.matches(probe)
