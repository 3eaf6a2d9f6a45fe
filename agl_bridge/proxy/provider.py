"""The LiteLLM custom provider: LiteLLM's proxy hands it chat requests, `ChatService` serves them.

Registered under the provider name `agl`, so a LiteLLM model entry `{"model": "agl/tiny"}` routes
to the service registered for `tiny`. A request to a served model arrives already parsed: the
pre-call hook (`litellm_hooks.ModelCheck`) validated the body and attached the `ChatRequest`
(`attach_request`), so its messages are normalised once; requests that reach the provider by other
ways (LiteLLM's Responses/Anthropic bridges, an alias in the user's config, `litellm.acompletion`
in-process) are parsed here. Responses carry vLLM's extra fields when the request asks with
`"return_token_ids": true`: top-level `prompt_token_ids` and `choices[i].token_ids`; in a stream,
every chunk carries the ids of the tokens whose text it holds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from litellm import CustomLLM
from litellm.types.utils import (
    ChatCompletionMessageToolCall,
    Choices,
    Delta,
    Function,
    Message,
    ModelResponse,
    ModelResponseStream,
    StreamingChoices,
    Usage,
)

from agl_bridge.chat import PromptEncoding, ToolCall
from agl_bridge.proxy.errors import to_litellm_error
from agl_bridge.proxy.openai_wire import logprobs_content, token_texts, tool_call_deltas
from agl_bridge.proxy.request import (
    BRIDGED_CALL,
    BridgedCall,
    ChatRequest,
    ChatResult,
    RequestError,
    RolloutRoute,
    route_of,
)
from agl_bridge.proxy.responses import PRIOR_TURNS, call_id, unique_start
from agl_bridge.proxy.service import ChatService
from agl_bridge.proxy.streaming import StreamDelta
from agl_bridge.sampler.remote_errors import RemoteSamplerError
from agl_bridge.store.errors import StoreError

PROVIDER_NAME = "agl"
_SYSTEM_FINGERPRINT = "agl-bridge"
_PARSED_KEY = "agl_chat_request"
_SERVING_ERRORS = (RequestError, StoreError, RemoteSamplerError)


@dataclass(frozen=True)
class _Parsed:
    """A chat request parsed by the pre-call hook, for the model it was parsed for."""

    model: str
    request: ChatRequest


def attach_request(data: dict[str, Any], model: str, request: ChatRequest) -> None:
    """Carry `request` (parsed from the body for served model `model`) in the request data LiteLLM
    hands to the provider, so that the provider does not parse the body again."""
    data.setdefault("metadata", {})[_PARSED_KEY] = _Parsed(model, request)


class AglProvider(CustomLLM):
    """LiteLLM `CustomLLM` over the `ChatService`s registered by served model name."""

    def __init__(self) -> None:
        super().__init__()
        self._services: dict[str, ChatService] = {}

    def register(self, service: ChatService) -> None:
        """Serve `service.model_name` (as LiteLLM model `agl/<name>`)."""
        self._services[service.model_name] = service

    def find(self, model: str) -> ChatService | None:
        """The service behind `model` (a served name, or `agl/<name>`), or None."""
        return self._services.get(model.removeprefix(f"{PROVIDER_NAME}/"))

    def service(self, model: str) -> ChatService:
        """The service behind `model`; a 400 naming the served models if there is none."""
        service = self.find(model)
        if service is None:
            error = RequestError(f"model {model!r} is not served here; served: {sorted(self._services)}", "model")
            raise to_litellm_error(error, model)
        return service

    async def acompletion(
        self,
        model: str,
        messages: list,
        api_base: Any,
        custom_prompt_dict: Any,
        model_response: ModelResponse,
        print_verbose: Any,
        encoding: Any,
        api_key: Any,
        logging_obj: Any,
        optional_params: dict,
        acompletion: Any = None,
        litellm_params: dict | None = None,
        logger_fn: Any = None,
        headers: Any = None,
        timeout: Any = None,
        client: Any = None,
    ) -> ModelResponse:
        """Serve a non-streaming chat completion."""
        service = self.service(model)
        route, started = route_of(litellm_params), unique_start()
        try:
            request = _request(service, messages, optional_params, litellm_params)
            result = await service.complete(request, route, started=started)
        except _SERVING_ERRORS as error:
            raise to_litellm_error(error, model) from None
        model_response.id = call_id(route, started)
        _tell_bridge(result)
        return _fill_response(model_response, model, service, request, result)

    # LiteLLM's base is a coroutine typed to return GenericStreamingChunks; LiteLLM also takes an async
    # generator of ModelResponseStream chunks, which this is.
    async def astreaming(  # type: ignore[override]
        self,
        model: str,
        messages: list,
        api_base: Any,
        custom_prompt_dict: Any,
        model_response: ModelResponse,
        print_verbose: Any,
        encoding: Any,
        api_key: Any,
        logging_obj: Any,
        optional_params: dict,
        acompletion: Any = None,
        litellm_params: dict | None = None,
        logger_fn: Any = None,
        headers: Any = None,
        timeout: Any = None,
        client: Any = None,
    ) -> AsyncIterator[ModelResponseStream]:
        """Serve a streaming chat completion, token by token."""
        service = self.service(model)
        bridged = BRIDGED_CALL.get()
        try:
            request = _request(service, messages, optional_params, litellm_params)
            route, started = route_of(litellm_params), unique_start()
            chunks = _stream_chunks(service, request, route, model, started, bridged)
            async for chunk in chunks:
                if bridged is not None:
                    bridged.sampled = True
                yield chunk
        except _SERVING_ERRORS as error:
            if bridged is not None and not bridged.sampled:
                bridged.failure = error
            raise to_litellm_error(error, model) from None


def _request(
    service: ChatService, messages: list, optional_params: dict, litellm_params: Mapping[str, Any] | None
) -> ChatRequest:
    """The request the pre-call hook parsed for this service, else the call's parameters parsed now."""
    parsed = ((litellm_params or {}).get("metadata") or {}).get(_PARSED_KEY)
    if isinstance(parsed, _Parsed) and parsed.model == service.model_name:
        return parsed.request
    prior = PRIOR_TURNS.get()  # a Responses request continuing a stored response (`previous_response_id`)
    if prior is not None:
        messages = prior.before(messages)
    return service.parse_request({**optional_params, "messages": messages})


def _fill_response(
    response: ModelResponse, model: str, service: ChatService, request: ChatRequest, result: ChatResult
) -> ModelResponse:
    choices = []
    for choice in result.choices:
        message = Message(
            content=choice.message.content, role="assistant", tool_calls=_tool_calls(choice.message.tool_calls)
        )
        logprobs = (
            logprobs_content(
                token_texts(service.codec.tokenizer),
                choice.sequence.tokens,
                choice.sequence.logprobs,
                choice.top_logprobs,
            )
            if request.logprobs
            else None
        )
        out = Choices(
            index=choice.index, message=message, finish_reason=choice.message.finish_reason, logprobs=logprobs
        )
        if request.return_token_ids:
            out.token_ids = list(choice.sequence.tokens)  # type: ignore[attr-defined]  # vLLM's extra field
        choices.append(out)
    response.choices = choices
    response.model = model
    response.usage = _usage(result)  # type: ignore[attr-defined]  # set dynamically by LiteLLM, not declared
    if request.return_token_ids:
        response.prompt_token_ids = list(result.prompt_token_ids)  # type: ignore[attr-defined]  # vLLM's extra field
    return response


async def _stream_chunks(
    service: ChatService,
    request: ChatRequest,
    route: RolloutRoute,
    model: str,
    started: float,
    bridged: BridgedCall | None = None,
) -> AsyncIterator[ModelResponseStream]:
    """SSE chunks. Each choice's newest delta is held back one step so that its last chunk has
    content to carry finish_reason and usage (LiteLLM drops a trailing chunk without content).

    With `top_logprobs`, a choice's content is held back whole and sent in its last chunk: the
    alternatives are scored once sampling has ended, and every token's entry must carry them.
    """
    stream_id = call_id(route, started)
    created = int(started)
    prompt_ids: list[int] | None = None
    held: dict[int, StreamDelta] = {}

    def make_chunk(choice: StreamingChoices, usage: Usage | None = None) -> ModelResponseStream:
        nonlocal prompt_ids
        out = ModelResponseStream(id=stream_id, created=created, model=model, choices=[choice])
        if prompt_ids is not None:
            # vLLM sends the prompt ids once, on the first chunk
            out.prompt_token_ids = prompt_ids  # type: ignore[attr-defined]  # vLLM's extra field
            prompt_ids = None
        if usage is not None:
            out.usage = usage
        if request.return_token_ids:
            # LiteLLM's proxy writes plain text chunks with a fast serializer that keeps only the
            # OpenAI fields (dropping token_ids); a chunk with a system_fingerprint takes the full one.
            out.system_fingerprint = _SYSTEM_FINGERPRINT
        return out

    async for item in service.stream(request, route, started=started):
        if isinstance(item, PromptEncoding):
            prompt_ids = list(item.token_ids) if request.return_token_ids else None
            if bridged is not None:
                bridged.prompt_tokens = len(item.token_ids)
        elif isinstance(item, StreamDelta):
            previous = held.get(item.index)
            if previous is not None and request.top_logprobs:
                held[item.index] = previous.extended(item)
                continue
            held[item.index] = item
            if previous is not None:
                yield make_chunk(_streaming_choice(service, request, previous))
        else:
            _tell_bridge(item)
            last = len(item.choices) - 1
            for position, (choice, piece) in enumerate(zip(item.choices, item.final_pieces, strict=True)):
                before = held.pop(choice.index, None) or StreamDelta(choice.index, "", [], [])
                final = _streaming_choice(
                    service,
                    request,
                    before.extended(piece),
                    tool_calls=tool_call_deltas(piece.message.tool_calls) or None,
                    top=choice.top_logprobs if request.top_logprobs else None,
                )
                final.finish_reason = choice.message.finish_reason
                yield make_chunk(final, usage=_usage(item) if position == last else None)


def _tell_bridge(result: ChatResult) -> None:
    """Tell the front door what LiteLLM's bridges leave out of their answer (`BridgedCall`)."""
    bridged = BRIDGED_CALL.get()
    if bridged is not None and result.choices:
        bridged.prompt_tokens = len(result.prompt_token_ids)
        bridged.stop_sequence = result.choices[0].message.stop_string


def _streaming_choice(
    service: ChatService,
    request: ChatRequest,
    delta: StreamDelta,
    tool_calls: list[dict[str, Any]] | None = None,
    top: list[list[tuple[int, float]]] | None = None,
) -> StreamingChoices:
    """A chunk's choice; `top` (one list of alternatives per token of `delta`) fills `top_logprobs`."""
    out = StreamingChoices(
        index=delta.index,
        delta=Delta(role="assistant", content=delta.text, tool_calls=tool_calls),
        logprobs=logprobs_content(token_texts(service.codec.tokenizer), delta.token_ids, delta.logprobs, top)
        if request.logprobs
        else None,
    )
    if request.return_token_ids:
        out.token_ids = list(delta.token_ids)  # type: ignore[attr-defined]  # vLLM's extra field
    return out


def _tool_calls(calls: list[ToolCall]) -> list[ChatCompletionMessageToolCall] | None:
    if not calls:
        return None
    return [
        ChatCompletionMessageToolCall(
            id=c.id, type="function", function=Function(name=c.function.name, arguments=c.function.arguments)
        )
        for c in calls
    ]


def _usage(result: ChatResult) -> Usage:
    prompt = len(result.prompt_token_ids)
    return Usage(
        prompt_tokens=prompt, completion_tokens=result.completion_tokens, total_tokens=prompt + result.completion_tokens
    )
