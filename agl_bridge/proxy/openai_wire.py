"""OpenAI's chat-completions wire format for our results, built with the `openai` package's own types.

`completion` turns a `ChatResult` into a `ChatCompletion`; `ChunkWriter` turns a chat stream
(`ChatService.stream`) into `ChatCompletionChunk`s, one per delta as soon as it is safe to send,
then each choice's last chunk with its `finish_reason`, and — when the request asked with
`stream_options.include_usage` — OpenAI's closing chunk with no choices and the usage. vLLM's extra
fields ride along when the request sets `return_token_ids`: `prompt_token_ids` (on the response,
or a stream's first chunk) and `token_ids` per choice (per chunk: the ids of the tokens whose text
it carries). The logprob entries (`logprobs_content`) are shared with the LiteLLM provider.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from typing import Any

from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta, ChoiceDeltaToolCall
from openai.types.chat.chat_completion_chunk import ChoiceLogprobs as ChunkLogprobs
from openai.types.chat.chat_completion_message_function_tool_call import (
    ChatCompletionMessageFunctionToolCall,
    Function,
)
from openai.types.completion_usage import CompletionUsage

from agl_bridge.chat import PromptEncoding, ToolCall
from agl_bridge.proxy.request import ChatRequest, ChatResult
from agl_bridge.proxy.streaming import FinalPiece, StreamDelta

TokenText = Callable[[int], str]


def token_texts(tokenizer: Any) -> TokenText:
    """A cached `token id -> its text` for `tokenizer` (logprob entries name each token by its text)."""
    return _cached_decoder(id(tokenizer), tokenizer)


@lru_cache(maxsize=8)
def _cached_decoder(_key: int, tokenizer: Any) -> TokenText:
    @lru_cache(maxsize=65536)
    def text_of(token: int) -> str:
        return str(tokenizer.decode([token], skip_special_tokens=False))

    return text_of


def logprobs_content(
    text_of: TokenText,
    tokens: Sequence[int],
    logprobs: Sequence[float],
    top: Sequence[Sequence[tuple[int, float]]] | None = None,
) -> dict[str, Any]:
    """OpenAI `logprobs`: each token's text, raw logprob, bytes and (if asked) its alternatives."""
    content = []
    for position, (token, logprob) in enumerate(zip(tokens, logprobs, strict=True)):
        text = text_of(token)
        alternatives = (
            []
            if top is None
            else [{"token": text_of(t), "logprob": lp, "bytes": list(text_of(t).encode())} for t, lp in top[position]]
        )
        content.append({"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": alternatives})
    return {"content": content}


def tool_call_deltas(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    """A stream's `delta.tool_calls` for complete tool calls (each sent whole, in one chunk)."""
    return [
        {
            "index": i,
            "id": c.id,
            "type": "function",
            "function": {"name": c.function.name, "arguments": c.function.arguments},
        }
        for i, c in enumerate(calls)
    ]


def usage_of(result: ChatResult) -> CompletionUsage:
    """Prompt and completion tokens of a finished request (all choices)."""
    prompt = len(result.prompt_token_ids)
    completion = result.completion_tokens
    return CompletionUsage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def response_id() -> str:
    """A fresh `chatcmpl-…` id."""
    return f"chatcmpl-{uuid.uuid4().hex}"


def completion(
    model: str, request: ChatRequest, result: ChatResult, text_of: TokenText, *, completion_id: str | None = None
) -> ChatCompletion:
    """The `ChatCompletion` answering `request` (its id `completion_id`, else a fresh one)."""
    choices = []
    for choice in result.choices:
        message = ChatCompletionMessage(role="assistant", content=choice.message.content)
        if choice.message.tool_calls:
            message.tool_calls = [
                ChatCompletionMessageFunctionToolCall(
                    id=c.id, type="function", function=Function(name=c.function.name, arguments=c.function.arguments)
                )
                for c in choice.message.tool_calls
            ]
        out = Choice(index=choice.index, message=message, finish_reason=choice.message.finish_reason)
        if request.logprobs:
            out.logprobs = ChoiceLogprobs.model_validate(
                logprobs_content(text_of, choice.sequence.tokens, choice.sequence.logprobs, choice.top_logprobs)
            )
        if request.return_token_ids:
            out.token_ids = list(choice.sequence.tokens)  # type: ignore[attr-defined]  # vLLM's extra field
        choices.append(out)
    response = ChatCompletion(
        id=completion_id or response_id(),
        object="chat.completion",
        created=int(time.time()),
        model=model,
        choices=choices,
        usage=usage_of(result),
    )
    if request.return_token_ids:
        response.prompt_token_ids = list(result.prompt_token_ids)  # type: ignore[attr-defined]  # vLLM's extra field
    return response


class ChunkWriter:
    """Turns the items of `ChatService.stream` into `ChatCompletionChunk`s for one request.

    With `top_logprobs`, a choice's content is held back and sent whole in its last chunk: the
    alternatives are scored once sampling has ended, and every token's entry must carry them.
    """

    def __init__(
        self,
        model: str,
        request: ChatRequest,
        text_of: TokenText,
        *,
        include_usage: bool,
        completion_id: str | None = None,
    ) -> None:
        self.model = model
        self.request = request
        self.text_of = text_of
        self.include_usage = include_usage
        self.id = completion_id or response_id()
        self.created = int(time.time())
        self._prompt_ids: list[int] | None = None
        self._held: dict[int, StreamDelta] = {}
        self._started: set[int] = set()

    def chunks(self, item: PromptEncoding | StreamDelta | ChatResult) -> Iterator[ChatCompletionChunk]:
        """The chunks one stream item becomes (none, one, or a choice's last chunks and the usage)."""
        if isinstance(item, PromptEncoding):
            self._prompt_ids = list(item.token_ids) if self.request.return_token_ids else None
        elif isinstance(item, StreamDelta):
            if self.request.top_logprobs:
                previous = self._held.get(item.index)
                self._held[item.index] = item if previous is None else previous.extended(item)
            else:
                yield self._chunk(self._choice(item.index, item))
        else:
            for choice, piece in zip(item.choices, item.final_pieces, strict=True):
                held = self._held.pop(choice.index, None)
                last = self._choice(
                    choice.index,
                    piece if held is None else held.extended(piece),
                    tool_calls=tool_call_deltas(piece.message.tool_calls),
                    top=choice.top_logprobs if self.request.top_logprobs else None,
                )
                last.finish_reason = choice.message.finish_reason
                yield self._chunk(last)
            if self.include_usage:
                yield self._chunk(None, usage=usage_of(item))

    def _choice(
        self,
        index: int,
        delta: StreamDelta | FinalPiece,
        tool_calls: list[dict[str, Any]] | None = None,
        top: list[list[tuple[int, float]]] | None = None,
    ) -> ChunkChoice:
        if index in self._started:
            content = ChoiceDelta(content=delta.text) if delta.text else ChoiceDelta()
        else:  # OpenAI names the role in each choice's first delta
            self._started.add(index)
            content = ChoiceDelta(role="assistant", content=delta.text)
        if tool_calls:
            content.tool_calls = [ChoiceDeltaToolCall.model_validate(call) for call in tool_calls]
        out = ChunkChoice(index=index, delta=content)
        if self.request.logprobs:
            out.logprobs = ChunkLogprobs.model_validate(
                logprobs_content(self.text_of, delta.token_ids, delta.logprobs, top)
            )
        if self.request.return_token_ids:
            out.token_ids = list(delta.token_ids)  # type: ignore[attr-defined]  # vLLM's extra field
        return out

    def _chunk(self, choice: ChunkChoice | None, usage: CompletionUsage | None = None) -> ChatCompletionChunk:
        chunk = ChatCompletionChunk(
            id=self.id,
            object="chat.completion.chunk",
            created=self.created,
            model=self.model,
            choices=[] if choice is None else [choice],
        )
        if usage is not None:
            chunk.usage = usage
        if self._prompt_ids is not None:  # vLLM sends the prompt ids once, on the first chunk
            chunk.prompt_token_ids = self._prompt_ids  # type: ignore[attr-defined]  # vLLM's extra field
            self._prompt_ids = None
        return chunk
