"""Our chat results as LiteLLM's chat types: what its provider interface returns and its protocol translators read.

`model_response` fills a `ModelResponse` from a `ChatResult`; `stream_chunks` turns the items of
`ChatService.stream` into `ModelResponseStream` chunks. Both carry vLLM's extra fields when the request asks with
`"return_token_ids": true`: top-level `prompt_token_ids` and `choices[i].token_ids`; in a stream,
every chunk carries the ids of the tokens whose text it holds. Used by the LiteLLM provider
(`provider`), for the calls LiteLLM's proxy or `litellm.acompletion` hands it; the front door's
routes write their answers without LiteLLM's types (`openai_wire`, `responses_wire`, `anthropic_wire`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

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
from agl_bridge.proxy.openai_wire import TokenText, logprobs_content, tool_call_deltas
from agl_bridge.proxy.request import ChatRequest, ChatResult
from agl_bridge.proxy.streaming import StreamDelta

SYSTEM_FINGERPRINT = "agl-bridge"


def model_response(
    response: ModelResponse, model: str, text_of: TokenText, request: ChatRequest, result: ChatResult
) -> ModelResponse:
    """`response` (its id set by the caller) filled with `result`'s choices and usage."""
    choices = []
    for choice in result.choices:
        message = Message(
            content=choice.message.content, role="assistant", tool_calls=_tool_calls(choice.message.tool_calls)
        )
        logprobs = (
            logprobs_content(text_of, choice.sequence.tokens, choice.sequence.logprobs, choice.top_logprobs)
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
    response.usage = usage_of(result)  # type: ignore[attr-defined]  # set dynamically by LiteLLM, not declared
    if request.return_token_ids:
        response.prompt_token_ids = list(result.prompt_token_ids)  # type: ignore[attr-defined]  # vLLM's extra field
    return response


async def stream_chunks(
    items: AsyncIterator[PromptEncoding | StreamDelta | ChatResult],
    request: ChatRequest,
    text_of: TokenText,
    *,
    model: str,
    stream_id: str,
    created: int,
) -> AsyncIterator[ModelResponseStream]:
    """A served stream (the items of `ChatService.stream`) as chunks: one per delta, then each choice's last
    chunk with its `finish_reason` (and the usage on the very last).

    Each choice's newest delta is held back one step, so that its last chunk has content to carry
    finish_reason and usage (LiteLLM's stream wrapper drops a trailing chunk without content). With
    `top_logprobs`, a choice's content is held back whole and sent in its last chunk: the
    alternatives are scored once sampling has ended, and every token's entry must carry them.
    """
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
            out.system_fingerprint = SYSTEM_FINGERPRINT
        return out

    async for item in items:
        if isinstance(item, PromptEncoding):
            prompt_ids = list(item.token_ids) if request.return_token_ids else None
        elif isinstance(item, StreamDelta):
            previous = held.get(item.index)
            if request.top_logprobs:
                held[item.index] = item if previous is None else previous.extended(item)
            else:
                held[item.index] = item
                if previous is not None:
                    yield make_chunk(_streaming_choice(text_of, request, previous))
        else:
            last = len(item.choices) - 1
            for position, (choice, piece) in enumerate(zip(item.choices, item.final_pieces, strict=True)):
                before = held.pop(choice.index, None) or StreamDelta(choice.index, "", [], [])
                final = _streaming_choice(
                    text_of,
                    request,
                    before.extended(piece),
                    tool_calls=tool_call_deltas(piece.message.tool_calls) or None,
                    top=choice.top_logprobs if request.top_logprobs else None,
                )
                final.finish_reason = choice.message.finish_reason
                yield make_chunk(final, usage=usage_of(item) if position == last else None)


def _streaming_choice(
    text_of: TokenText,
    request: ChatRequest,
    delta: StreamDelta,
    tool_calls: list[dict[str, Any]] | None = None,
    top: list[list[tuple[int, float]]] | None = None,
) -> StreamingChoices:
    """A chunk's choice; `top` (one list of alternatives per token of `delta`) fills `top_logprobs`."""
    out = StreamingChoices(
        index=delta.index,
        delta=Delta(role="assistant", content=delta.text, tool_calls=tool_calls),
        logprobs=logprobs_content(text_of, delta.token_ids, delta.logprobs, top) if request.logprobs else None,
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


def usage_of(result: ChatResult) -> Usage:
    """LiteLLM's usage of a finished request (all choices)."""
    prompt = len(result.prompt_token_ids)
    return Usage(
        prompt_tokens=prompt, completion_tokens=result.completion_tokens, total_tokens=prompt + result.completion_tokens
    )
