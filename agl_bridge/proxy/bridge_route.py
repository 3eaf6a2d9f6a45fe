"""The served models' Responses and Anthropic Messages requests, answered at the front door.

`POST /v1/responses` and `POST /v1/messages` for a model this proxy serves are translated to a chat
request with LiteLLM's own translations (the Anthropic adapter
`litellm.llms.anthropic.pass_through.adapters`, the Responses ⇄ chat transformation
`litellm.responses.litellm_completion_transformation`; built against litellm 1.106.2), and that
chat request is served by the `ChatService` exactly as a chat completion is (`chat_route`): the
same validation, recording with exact token ids, rollout routing and errors — each refusal in
the protocol's own shape (`errors`). The answer goes back through the same translations, streamed
or not. LiteLLM's proxy app (its middleware, auth, router, logging) is not involved: it cost about
8 ms of CPU per request. Other models keep going through LiteLLM's own bridges.

A stream starts once its first token is sampled, so a request refused before (a prompt over the
context) gets a plain JSON error with its status; a failure after that ends the stream with the
protocol's error event. What LiteLLM's translations leave out or need is filled in by
`litellm_patches` (one module for every LiteLLM work-around).
"""

from __future__ import annotations

import enum
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast, get_type_hints

from litellm.llms.anthropic.pass_through.adapters.streaming_iterator import AnthropicStreamWrapper
from litellm.llms.anthropic.pass_through.adapters.transformation import AnthropicAdapter
from litellm.responses.additional_tools import hoist_additional_tools
from litellm.responses.litellm_completion_transformation.streaming_iterator import (
    LiteLLMCompletionStreamingIterator,
)
from litellm.responses.litellm_completion_transformation.transformation import LiteLLMCompletionResponsesConfig
from litellm.responses.utils import ResponsesAPIRequestUtils
from litellm.types.llms.openai import ResponsesAPIOptionalRequestParams
from litellm.types.utils import ModelResponse, ModelResponseStream
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from agl_bridge.chat import PromptEncoding
from agl_bridge.proxy.errors import WireProtocol, api_error, error_body, logged, send_error
from agl_bridge.proxy.litellm_patches import (
    ChunkSource,
    anthropic_event_fixed,
    anthropic_message_fixed,
    responses_stream_with_id,
    translation_refused,
)
from agl_bridge.proxy.litellm_wire import StreamedCall, model_response, stream_chunks
from agl_bridge.proxy.openai_wire import token_texts
from agl_bridge.proxy.provider import PROVIDER_NAME
from agl_bridge.proxy.request import ChatResult, RequestError, RolloutRoute
from agl_bridge.proxy.responses import call_id, resolve_previous_response, unique_start
from agl_bridge.proxy.service import ChatService
from agl_bridge.proxy.sse import SSE_HEADERS, sse_data

T = TypeVar("T")

MESSAGES_PATHS = frozenset({"/v1/messages", "/messages"})
COUNT_TOKENS_PATHS = frozenset({"/v1/messages/count_tokens", "/messages/count_tokens"})
RESPONSES_PATHS = frozenset({"/v1/responses", "/responses"})
BRIDGED_PATHS = MESSAGES_PATHS | COUNT_TOKENS_PATHS | RESPONSES_PATHS
"""The paths whose requests for a served model are answered here (LiteLLM serves the same)."""

_JSON_HEADERS = [(b"content-type", b"application/json")]
# The arguments LiteLLM's Anthropic endpoint reads itself; every other field of the body is passed on to the
# chat call as it is (as LiteLLM's handler does), where the chat service judges it.
_ANTHROPIC_ARGUMENTS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "metadata",
        "stop_sequences",
        "stream",
        "system",
        "temperature",
        "thinking",
        "tool_choice",
        "tools",
        "top_k",
        "top_p",
        "output_format",
        "output_config",
        "context_management",
    }
)


@dataclass
class _Translated:
    """A bridged request as a chat body, with what its answer's translation needs back."""

    chat: dict[str, Any]
    model: str
    stream: bool
    tool_names: dict[str, str] = field(default_factory=dict)
    """Anthropic: tool names LiteLLM shortened for OpenAI's 64-character limit, by their short name."""
    request_input: Any = None
    """Responses: the request's `input` (after LiteLLM hoisted its tools)."""
    responses_request: dict[str, Any] = field(default_factory=dict)
    """Responses: the request's optional fields, which its answer echoes."""


class BridgeRoute:
    """Answers `/v1/responses` and `/v1/messages` for served models (the service is chosen by the gateway)."""

    async def __call__(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        service: ChatService,
        body: Mapping[str, Any],
        route: RolloutRoute,
    ) -> None:
        """Answer one bridged request (the body parsed and shape-checked, its model served by `service`)."""
        anthropic = scope["path"] not in RESPONSES_PATHS
        protocol = WireProtocol.ANTHROPIC if anthropic else WireProtocol.OPENAI
        try:
            translated = _from_anthropic(body) if anthropic else await _from_responses(service, body)
            request = service.parse_request(translated.chat)
            if scope["path"] in COUNT_TOKENS_PATHS:
                counted = await service.count_prompt_tokens(request, route)
                await _send_json(send, json.dumps({"input_tokens": counted}).encode())
                return
            started = unique_start()
            response_id = call_id(route, started)
            if not translated.stream:
                result = await service.complete(request, route, started=started)
                chat = model_response(
                    _chat_response(response_id, anthropic),
                    translated.model,
                    token_texts(service.codec.tokenizer),
                    request,
                    result,
                )
                data = (
                    _anthropic_message(translated, chat, result) if anthropic else _responses_answer(translated, chat)
                )
                await _send_json(send, data)
                return
            items = service.stream(request, route, started=started)
            prompt = await anext(items)  # encoded: a prompt over the context is refused here
            assert isinstance(prompt, PromptEncoding)  # the stream's first item
            call = StreamedCall(prompt_tokens=len(prompt.token_ids))
            chunks = _Source(
                stream_chunks(
                    _prepended(prompt, items),
                    request,
                    token_texts(service.codec.tokenizer),
                    model=translated.model,
                    stream_id=response_id,
                    created=int(started),
                    hold_last=False,
                    call=call,
                )
            )
            if anthropic:
                events = _opening_coalesced(_anthropic_events(translated, chunks, call), chunks)
            else:
                events = _opening_coalesced(_responses_events(translated, chunks, response_id), chunks)
            # The opening events are made before the first token is sampled and written with it; a failure
            # before it gets a JSON error with its status.
            first = await anext(events)
        except Exception as exc:  # every refusal and failure is answered in the protocol's shape
            await send_error(send, logged(api_error(exc), exc, scope), protocol)
            return
        response = StreamingResponse(
            _guarded(_prepended(first, events), protocol, scope), media_type="text/event-stream", headers=SSE_HEADERS
        )
        await response(scope, receive, send)


async def _send_json(send: Send, data: bytes) -> None:
    headers = [*_JSON_HEADERS, (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def _chat_response(response_id: str, anthropic: bool) -> ModelResponse:
    # Anthropic's message ids are `msg_…`; the rest still names the recorded call.
    return ModelResponse(id="msg_" + response_id.removeprefix("chatcmpl-") if anthropic else response_id)


# ----------------------------------------------------------------------------------------- Anthropic


def _from_anthropic(body: Mapping[str, Any]) -> _Translated:
    """An Anthropic Messages body as a chat body (LiteLLM's `AnthropicAdapter`)."""

    arguments = {k: v for k, v in body.items() if k in _ANTHROPIC_ARGUMENTS and k != "stream" and v is not None}
    arguments["model"] = f"{PROVIDER_NAME}/{body['model']}"
    with translation_refused("Anthropic Messages"):
        chat, tool_names = AnthropicAdapter().translate_completion_input_params_with_tool_mapping(
            arguments, custom_llm_provider=PROVIDER_NAME
        )
    if chat is None:
        raise RequestError("messages: a non-empty list of {role, content} objects is required", "messages")
    extra = {k: v for k, v in body.items() if k not in _ANTHROPIC_ARGUMENTS and v is not None}
    return _Translated({**extra, **chat}, str(body["model"]), body.get("stream") is True, tool_names=tool_names)


def _anthropic_message(translated: _Translated, chat: Any, result: ChatResult) -> bytes:
    message = AnthropicAdapter().translate_completion_output_params(chat, tool_name_mapping=translated.tool_names)
    if message is None:
        raise RuntimeError("LiteLLM's Anthropic adapter translated no message")
    stop = result.choices[0].message.stop_string if result.choices else None
    return json.dumps(anthropic_message_fixed(cast(dict[str, Any], message), stop), default=_jsonable).encode()


async def _anthropic_events(
    translated: _Translated, chunks: AsyncIterator[Any], call: StreamedCall
) -> AsyncIterator[tuple[str, bytes]]:
    """Anthropic's stream events (LiteLLM's `AnthropicStreamWrapper`), completed from `call`."""

    wrapper = AnthropicStreamWrapper(
        completion_stream=cast(Any, chunks), model=translated.model, tool_name_mapping=translated.tool_names
    )
    async for event in wrapper:
        if isinstance(event, dict):
            event = anthropic_event_fixed(event, call)
            kind = str(event.get("type", "message"))
            yield kind, f"event: {kind}\ndata: {json.dumps(event, default=_jsonable)}\n\n".encode()


# ----------------------------------------------------------------------------------------- Responses

_RESPONSES_ARGUMENTS = frozenset({"model", "input", "stream"})
_RESPONSES_FIELDS = frozenset(get_type_hints(ResponsesAPIOptionalRequestParams)) - _RESPONSES_ARGUMENTS
"""The Responses request's optional fields as LiteLLM knows them; the others are passed on to the chat call
(as LiteLLM's handler does), where the chat service judges them."""


async def _from_responses(service: ChatService, body: Mapping[str, Any]) -> _Translated:
    """A Responses body as a chat body (LiteLLM's `LiteLLMCompletionResponsesConfig`), continuing the recorded
    turns its `previous_response_id` names."""

    request = {k: v for k, v in body.items() if k in _RESPONSES_FIELDS and v is not None}
    extra = {k: v for k, v in body.items() if k not in _RESPONSES_FIELDS | _RESPONSES_ARGUMENTS and v is not None}
    stream = body.get("stream") is True
    with translation_refused("Responses"):
        hoisted = hoist_additional_tools(body["input"], request.get("tools"))
        if hoisted.hoisted:
            request["tools"] = list(hoisted.tools)
        chat = LiteLLMCompletionResponsesConfig.transform_responses_api_request_to_chat_completion_request(
            model=f"{PROVIDER_NAME}/{body['model']}",
            input=hoisted.input,
            responses_api_request=request,  # type: ignore[arg-type]  # checked by bridge_checks
            custom_llm_provider=PROVIDER_NAME,
            stream=stream,
        )
    prior = await resolve_previous_response(service.recorder.store, service.codec, dict(body))
    if prior is not None:
        chat["messages"] = prior.before(list(chat["messages"]))
    return _Translated(
        {**extra, **chat}, str(body["model"]), stream, request_input=hoisted.input, responses_request=request
    )


def _responses_answer(translated: _Translated, chat: Any) -> bytes:
    response = LiteLLMCompletionResponsesConfig.transform_chat_completion_response_to_responses_api_response(
        request_input=translated.request_input,
        responses_api_request=translated.responses_request,  # type: ignore[arg-type]
        chat_completion_response=chat,
    )
    response = ResponsesAPIRequestUtils.update_responses_api_response_id_with_model_id(
        responses_api_response=response, custom_llm_provider=PROVIDER_NAME
    )
    return response.model_dump_json().encode()


async def _responses_events(
    translated: _Translated, chunks: AsyncIterator[Any], response_id: str
) -> AsyncIterator[tuple[str, bytes]]:
    """The Responses API's stream events (LiteLLM's `LiteLLMCompletionStreamingIterator`)."""

    events = responses_stream_with_id(
        LiteLLMCompletionStreamingIterator(
            model=translated.model,
            litellm_custom_stream_wrapper=ChunkSource.of(chunks),
            request_input=translated.request_input,
            responses_api_request=translated.responses_request,  # type: ignore[arg-type]
            custom_llm_provider=PROVIDER_NAME,
        ),
        response_id,
    )
    async for event in events:
        data = event.model_dump_json(exclude_none=True, exclude_unset=True)
        kind = getattr(event, "type", "message")
        kind = kind.value if isinstance(kind, enum.Enum) else str(kind)  # LiteLLM's event types are str enums
        yield kind, f"event: {kind}\ndata: {data}\n\n".encode()


# ----------------------------------------------------------------------------------------- streams


class _Source:
    """The served chunks, counting how many were read."""

    def __init__(self, chunks: AsyncIterator[ModelResponseStream]) -> None:
        self.chunks = chunks
        self.read = 0

    def __aiter__(self) -> _Source:
        return self

    async def __anext__(self) -> ModelResponseStream:
        self.read += 1
        return await anext(self.chunks)


async def _prepended(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    yield first
    async for item in rest:
        yield item


_OPENING_EVENTS = frozenset(
    {
        "message_start",
        "content_block_start",
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    }
)
"""Events a stream opens with before its first content: made before the first token or from it."""


async def _opening_coalesced(events: AsyncIterator[tuple[str, bytes]], source: _Source) -> AsyncIterator[bytes]:
    """The events' bytes, the opening ones written together with the first content event.

    A client then wakes once for its first token, as it does for a chat completion's first chunk,
    not once per opening event (on a busy machine each wake-up can cost a scheduling slice). None
    is held past the first chunk: the opening events all come before or from it.
    """
    opening: list[bytes] | None = []
    async for kind, data in events:
        if opening is not None and kind in _OPENING_EVENTS and source.read <= 1:
            opening.append(data)
            continue
        if opening:
            data = b"".join([*opening, data])
        opening = None
        yield data
    if opening:
        yield b"".join(opening)


async def _guarded(events: AsyncIterator[bytes], protocol: WireProtocol, scope: Scope) -> AsyncIterator[bytes]:
    """`events`; a failure mid-stream (the status is sent already) becomes the protocol's error event."""
    try:
        async for event in events:
            yield event
    except Exception as exc:
        error = error_body(logged(api_error(exc), exc, scope), protocol)
        yield b"event: error\n" + sse_data(error) if protocol is WireProtocol.ANTHROPIC else sse_data(error)


def _jsonable(value: Any) -> Any:
    """What `json.dumps` makes of the pydantic objects inside LiteLLM's Anthropic dicts."""
    dump = getattr(value, "model_dump", None)
    if dump is None:
        raise TypeError(f"{type(value).__name__} is not JSON serializable")
    return dump(exclude_none=True)
