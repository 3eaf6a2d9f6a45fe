"""The LiteLLM custom provider: LiteLLM's proxy hands it chat requests, `ChatService` serves them.

Registered under the provider name `agl`, so a LiteLLM model entry `{"model": "agl/tiny"}` routes
to the service registered for `tiny`. A request to a served model arrives already parsed: the
pre-call hook (`litellm_hooks.ModelCheck`) validated the body and attached the `ChatRequest`
(`attach_request`), so its messages are normalised once; requests that reach the provider by other
ways (an alias in the user's config, LiteLLM's Responses/Anthropic bridges for such an alias,
`litellm.acompletion` in-process) are parsed here. The served models' own chat, Responses and
Anthropic requests never reach it: the front door answers them (`chat_route`, `bridge_route`).
Answers are built by `litellm_wire`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from litellm import CustomLLM
from litellm.types.utils import ModelResponse, ModelResponseStream

from agl_bridge.proxy.errors import to_litellm_error
from agl_bridge.proxy.litellm_wire import model_response as model_response_of
from agl_bridge.proxy.litellm_wire import stream_chunks
from agl_bridge.proxy.openai_wire import token_texts
from agl_bridge.proxy.request import ChatRequest, RequestError, route_of
from agl_bridge.proxy.responses import call_id, unique_start
from agl_bridge.proxy.service import ChatService
from agl_bridge.sampler.remote_errors import RemoteSamplerError
from agl_bridge.store.errors import StoreError

PROVIDER_NAME = "agl"
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
        return model_response_of(model_response, model, token_texts(service.codec.tokenizer), request, result)

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
        try:
            request = _request(service, messages, optional_params, litellm_params)
            route, started = route_of(litellm_params), unique_start()
            chunks = stream_chunks(
                service.stream(request, route, started=started),
                request,
                token_texts(service.codec.tokenizer),
                model=model,
                stream_id=call_id(route, started),
                created=int(started),
            )
            async for chunk in chunks:
                yield chunk
        except _SERVING_ERRORS as error:
            raise to_litellm_error(error, model) from None


def _request(
    service: ChatService, messages: list, optional_params: dict, litellm_params: Mapping[str, Any] | None
) -> ChatRequest:
    """The request the pre-call hook parsed for this service, else the call's parameters parsed now."""
    parsed = ((litellm_params or {}).get("metadata") or {}).get(_PARSED_KEY)
    if isinstance(parsed, _Parsed) and parsed.model == service.model_name:
        return parsed.request
    return service.parse_request({**optional_params, "messages": messages})
