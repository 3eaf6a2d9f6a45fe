"""The served models' chat completions, answered at the front door: the hot RL path, without LiteLLM.

An agent's `POST /v1/chat/completions` for a model this proxy serves is parsed by its `ChatService`
(the same validation as on every other path), sampled, recorded and answered here, in OpenAI's
wire format built with the `openai` package's types (`openai_wire`). LiteLLM's request pipeline —
its middleware, auth, router, callbacks and success logging — cost about 8 ms of CPU per request
and served nothing the RL path needs; every other model, route and protocol bridge (Responses,
Anthropic) still goes through LiteLLM (`gateway.Gateway` decides, from the body's `model`).

Each answer's id is `responses.call_id` of the request's route and the call's recorded start time, as
on every other path, so it names the recorded call (an agent can declare it as a later call's parent,
`x-agl-parent-call`).

Refusals are shaped by `errors`. A stream's first chunk is produced before its response starts,
so a request that fails before any token is sampled gets a plain JSON error with its status; a
failure after that ends the stream with an `error` event (the `openai` client raises it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from openai.types.chat import ChatCompletionChunk
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from agl_bridge.proxy.errors import api_error, error_body, logged, send_error
from agl_bridge.proxy.openai_wire import ChunkWriter, completion, token_texts
from agl_bridge.proxy.request import ChatRequest, RolloutRoute
from agl_bridge.proxy.responses import call_id, unique_start
from agl_bridge.proxy.service import ChatService
from agl_bridge.proxy.sse import SSE_DONE, SSE_HEADERS, sse_data, stream_options

CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
"""The paths whose requests for a served model are answered here (LiteLLM serves the same two)."""

_JSON_HEADERS = [(b"content-type", b"application/json")]


class ChatRoute:
    """Answers chat completions for the models `find` knows (served name → its `ChatService`)."""

    def __init__(self, find: Callable[[str], ChatService | None]) -> None:
        self.find = find

    def service_for(self, body: Mapping[str, Any]) -> ChatService | None:
        """The service that answers `body` here, or None when LiteLLM should (another model, no model)."""
        model = body.get("model")
        return self.find(model) if isinstance(model, str) else None

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
        """Answer one chat request (the body already parsed, its model served by `service`)."""
        model = str(body["model"])
        try:
            request = service.parse_request(body)
            stream, include_usage = stream_options(body)
            started = unique_start()
            chat_id = call_id(route, started)
            if not stream:
                result = await service.complete(request, route, started=started)
                text_of = token_texts(service.codec.tokenizer)
                payload = completion(model, request, result, text_of, completion_id=chat_id)
                data = payload.model_dump_json(exclude_unset=True).encode()
                headers = [*_JSON_HEADERS, (b"content-length", str(len(data)).encode())]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": data})
                return
            writer = ChunkWriter(
                model, request, token_texts(service.codec.tokenizer), include_usage=include_usage, completion_id=chat_id
            )
            chunks = _chunks(service, request, route, writer, started)
            first = await anext(chunks)  # failures before the first chunk get a JSON error with their status
        except Exception as exc:  # every refusal and failure is answered in OpenAI's shape
            await send_error(send, logged(api_error(exc), exc, scope))
            return
        response = StreamingResponse(_events(first, chunks, scope), media_type="text/event-stream", headers=SSE_HEADERS)
        await response(scope, receive, send)


async def _chunks(
    service: ChatService, request: ChatRequest, route: RolloutRoute, writer: ChunkWriter, started: float
) -> AsyncIterator[ChatCompletionChunk]:
    async for item in service.stream(request, route, started=started):
        for chunk in writer.chunks(item):
            yield chunk


async def _events(
    first: ChatCompletionChunk, chunks: AsyncIterator[ChatCompletionChunk], scope: Scope
) -> AsyncIterator[bytes]:
    """Server-sent events: each chunk, then `[DONE]`; a failure mid-stream becomes an `error` event."""
    yield _event(first)
    try:
        async for chunk in chunks:
            yield _event(chunk)
    except Exception as exc:  # the status is sent already: the error goes in the stream
        error = logged(api_error(exc), exc, scope)
        yield sse_data(error_body(error))
        return
    yield SSE_DONE


def _event(chunk: ChatCompletionChunk) -> bytes:
    return b"data: " + chunk.model_dump_json(exclude_unset=True).encode() + b"\n\n"
