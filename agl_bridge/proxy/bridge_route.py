"""The served models' Responses and Anthropic Messages requests, answered at the front door.

`POST /v1/responses` and `POST /v1/messages` for a model this proxy serves are translated to a chat
request with LiteLLM's own request translations (the Anthropic adapter
`litellm.llms.anthropic.pass_through.adapters`, the Responses → chat transformation
`litellm.responses.litellm_completion_transformation`; built against litellm 1.106.2), and that
chat request is served by the `ChatService` exactly as a chat completion is (`chat_route`): the
same validation, recording with exact token ids, rollout routing and errors — each refusal in
the protocol's own shape (`errors`). The answer, streamed or not, is written by our own code in
the protocol's shape (`responses_wire`, `anthropic_wire`), as the chat route's is (`openai_wire`):
LiteLLM's answer translations needed our result as its chat objects first and cost more CPU than
the whole rest of an answer. LiteLLM's proxy app (its middleware, auth, router, logging) is not
involved either: it cost about 8 ms of CPU per request. Other models keep going through LiteLLM's
own bridges.

A stream starts once its first token is sampled, so a request refused before (a prompt over the
context) gets a plain JSON error with its status; a failure after that ends the stream with the
protocol's error event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_type_hints

from litellm.llms.anthropic.pass_through.adapters.transformation import AnthropicAdapter
from litellm.responses.additional_tools import hoist_additional_tools
from litellm.responses.litellm_completion_transformation.transformation import LiteLLMCompletionResponsesConfig
from litellm.types.llms.openai import ResponsesAPIOptionalRequestParams
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from agl_bridge.chat import PromptEncoding
from agl_bridge.proxy.anthropic_wire import AnthropicWriter
from agl_bridge.proxy.errors import WireProtocol, api_error, error_body, logged, send_error
from agl_bridge.proxy.litellm_patches import translation_refused
from agl_bridge.proxy.provider import PROVIDER_NAME
from agl_bridge.proxy.request import ChatResult, RequestError, RolloutRoute
from agl_bridge.proxy.responses import call_id, resolve_previous_response, response_id, unique_start
from agl_bridge.proxy.responses_wire import ResponsesWriter
from agl_bridge.proxy.service import ChatService
from agl_bridge.proxy.sse import SSE_HEADERS, sse_data
from agl_bridge.proxy.streaming import StreamDelta

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
    """A bridged request as a chat body, with what its answer needs back."""

    chat: dict[str, Any]
    model: str
    stream: bool
    tool_names: dict[str, str] = field(default_factory=dict)
    """Anthropic: tool names LiteLLM shortened for OpenAI's 64-character limit, by their short name."""
    responses_request: dict[str, Any] = field(default_factory=dict)
    """Responses: the request's optional fields (its tools hoisted), which its answer repeats."""


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
            translated = _from_anthropic(body) if anthropic else await _from_responses(service, body, route)
            request = service.parse_request(translated.chat)
            if scope["path"] in COUNT_TOKENS_PATHS:
                counted = await service.count_prompt_tokens(request, route)
                await _send_json(send, b'{"input_tokens":%d}' % counted)
                return
            if request.n != 1:  # the protocols have no `n`: one answer per request, one record
                raise RequestError(f"n: this route answers one message per request, got n={request.n}", "n")
            started = unique_start()
            chat_id = call_id(route, started)
            writer: AnthropicWriter | ResponsesWriter
            if anthropic:  # Anthropic's message ids are `msg_…`; the rest still names the recorded call
                writer = AnthropicWriter(
                    "msg_" + chat_id.removeprefix("chatcmpl-"), translated.model, translated.tool_names
                )
            else:
                writer = ResponsesWriter(
                    response_id(chat_id, PROVIDER_NAME), translated.model, int(started), translated.responses_request
                )
            if not translated.stream:
                await _send_json(send, writer.answer(await service.complete(request, route, started=started)))
                return
            events = _written(service.stream(request, route, started=started), writer)
            # The opening events are made once the prompt is encoded and written with the first token; a
            # failure before it gets a JSON error with its status.
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


_RESPONSES_ARGUMENTS = frozenset({"model", "input", "stream"})
_RESPONSES_FIELDS = frozenset(get_type_hints(ResponsesAPIOptionalRequestParams)) - _RESPONSES_ARGUMENTS
"""The Responses request's optional fields as LiteLLM knows them; the others are passed on to the chat call
(as LiteLLM's handler does), where the chat service judges them."""


async def _from_responses(service: ChatService, body: Mapping[str, Any], route: RolloutRoute) -> _Translated:
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
    prior = await resolve_previous_response(service.recorder.store, service.codec, dict(body), route)
    if prior is not None:
        chat["messages"] = prior.before(list(chat["messages"]))
    return _Translated({**extra, **chat}, str(body["model"]), stream, responses_request=request)


# ----------------------------------------------------------------------------------------- streams


async def _written(
    items: AsyncIterator[PromptEncoding | StreamDelta | ChatResult], writer: AnthropicWriter | ResponsesWriter
) -> AsyncIterator[bytes]:
    """The stream's events, as the writer makes them of each item; none empty (the first carries output)."""
    async for item in items:
        data = writer.events(item)
        if data:
            yield data


async def _prepended(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    yield first
    async for item in rest:
        yield item


async def _guarded(events: AsyncIterator[bytes], protocol: WireProtocol, scope: Scope) -> AsyncIterator[bytes]:
    """`events`; a failure mid-stream (the status is sent already) becomes the protocol's error event."""
    try:
        async for event in events:
            yield event
    except Exception as exc:
        error = error_body(logged(api_error(exc), exc, scope), protocol)
        yield b"event: error\n" + sse_data(error) if protocol is WireProtocol.ANTHROPIC else sse_data(error)
