"""Serving an OpenAI chat request from a token sampler and recording it exactly.

This is the proxy's core, kept free of LiteLLM and HTTP so that it can be called, tested and timed
on its own: parse and validate the request body, encode the messages to prompt ids (re-using the
rollout's sampled ids), sample, decode, and commit one `LLMCall` per choice to the store before the
response is handed back. `agl_bridge.proxy.provider` adapts it to LiteLLM.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from agl_bridge.chat import (
    AssistantMessage,
    ChatCodec,
    ChatFormatError,
    PromptEncoding,
    TokenCacheRegistry,
    normalize_messages,
    normalize_tools,
)
from agl_bridge.proxy.recording import CallRecorder
from agl_bridge.proxy.request import ChatRequest, ChatResult, ChoiceResult, RequestError, RolloutRoute
from agl_bridge.proxy.streaming import ChoiceStreamer, StreamDelta
from agl_bridge.proxy.token_history import StoreTokenHistory, recorded
from agl_bridge.sampler.base import (
    ContextLengthError,
    SampleResult,
    SamplingParamError,
    SamplingParams,
    TokenEvent,
    TokenSampler,
    stream_tokens,
)

MAX_TOP_LOGPROBS = 20
_TOOL_CHOICES = ("none", "auto", "required")


class ChatService:
    """Serves chat requests for one model name from one sampler, recording every call."""

    def __init__(
        self,
        *,
        sampler: TokenSampler,
        codec: ChatCodec,
        recorder: CallRecorder,
        model_name: str,
        token_caches: TokenCacheRegistry | None = None,
        history: StoreTokenHistory | None = None,
        default_max_tokens: int = 1024,
        max_samples_per_request: int = 64,
    ) -> None:
        self.sampler = sampler
        self.codec = codec
        self.recorder = recorder
        self.model_name = model_name
        self.token_caches = token_caches or TokenCacheRegistry(codec.tokenizer)
        self.history = history
        self.default_max_tokens = default_max_tokens
        self.max_samples_per_request = max_samples_per_request

    # ------------------------------------------------------------------ parsing

    def parse_request(self, body: Mapping[str, Any]) -> ChatRequest:
        """Validate an OpenAI chat-completions body; RequestError names the offending field."""
        if "messages" not in body:
            raise RequestError("'messages' is required: a non-empty list of chat messages", "messages")
        try:
            messages = normalize_messages(body["messages"])
            tools = normalize_tools(body.get("tools"))
        except ChatFormatError as error:
            raise RequestError(str(error), error.param) from None
        tool_choice = body.get("tool_choice")
        if tool_choice is not None and tool_choice not in _TOOL_CHOICES and not _is_named_tool_choice(tool_choice):
            raise RequestError(
                f"tool_choice must be one of {', '.join(_TOOL_CHOICES)} or "
                '{"type": "function", "function": {"name": ...}}, got ' + repr(tool_choice),
                "tool_choice",
            )
        n = _int_field("n", _or_default(body, "n", 1), minimum=1)
        if n > self.max_samples_per_request:
            raise RequestError(f"n must be at most {self.max_samples_per_request}, got {n}", "n")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        max_tokens = self.default_max_tokens if max_tokens is None else _int_field("max_tokens", max_tokens, minimum=1)
        stop_strings = _stop_strings(body.get("stop"))
        logprobs = body.get("logprobs") or False
        if not isinstance(logprobs, bool):
            raise RequestError(f"logprobs must be true or false, got {logprobs!r}", "logprobs")
        top_logprobs = _int_field("top_logprobs", _or_default(body, "top_logprobs", 0), minimum=0)
        if top_logprobs > MAX_TOP_LOGPROBS:
            raise RequestError(f"top_logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {top_logprobs}", "top_logprobs")
        if top_logprobs and not logprobs:
            raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
        template_kwargs = body.get("chat_template_kwargs")
        if template_kwargs is not None and not isinstance(template_kwargs, dict):
            raise RequestError("chat_template_kwargs must be an object", "chat_template_kwargs")
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=_number_field(body, "temperature", 1.0),
            top_p=_number_field(body, "top_p", 1.0),
            top_k=_int_field("top_k", _or_default(body, "top_k", -1), minimum=-1),
            stop=[*self.codec.stop_token_ids, *stop_strings],
            seed=body.get("seed"),
        )
        try:
            params.validate(getattr(self.sampler, "vocab_size", None))
        except SamplingParamError as error:
            raise RequestError(str(error), error.field) from None
        return ChatRequest(
            messages=messages,
            tools=tools,
            parse_tool_calls=tool_choice != "none",
            n=n,
            params=params,
            stop_strings=stop_strings,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            return_token_ids=bool(body.get("return_token_ids", False)),
            chat_template_kwargs=template_kwargs,
        )

    # ------------------------------------------------------------------ serving

    async def complete(self, request: ChatRequest, route: RolloutRoute) -> ChatResult:
        """Sample all choices, record them durably, and return the result."""
        started = time.time()
        await self._catch_up(request, route)
        prompt = self._encode(request, route)
        try:
            sampled = await self.sampler.sample_async(prompt.token_ids, request.params, request.n)
        except ContextLengthError as error:
            raise RequestError(str(error), "messages", code="context_length_exceeded") from None
        return await self._finish(request, route, prompt, sampled, started)

    async def stream(
        self, request: ChatRequest, route: RolloutRoute
    ) -> AsyncIterator[PromptEncoding | StreamDelta | ChatResult]:
        """Yield the prompt encoding, text deltas per choice as tokens are sampled, then the
        recorded ChatResult (whose `final_pieces` hold what each choice has left to send).

        Text that could still turn into a stop string or a `<tool_call>` block is held back until
        it is certain, so the deltas joined are exactly the final message content.
        """
        started = time.time()
        await self._catch_up(request, route)
        prompt = self._encode(request, route)
        yield prompt
        streamers = [
            ChoiceStreamer(self.codec, request.stop_strings, parse_tool_calls=request.parse_tool_calls)
            for _ in range(request.n)
        ]
        sampled: SampleResult | None = None
        try:
            async for item in stream_tokens(self.sampler, prompt.token_ids, request.params, request.n):
                if isinstance(item, TokenEvent):
                    delta = streamers[item.sample_index].push(item)
                    if delta is not None:
                        yield StreamDelta(item.sample_index, *delta)
                else:
                    sampled = item
        except ContextLengthError as error:
            raise RequestError(str(error), "messages", code="context_length_exceeded") from None
        assert sampled is not None
        yield await self._finish(request, route, prompt, sampled, started, streamers)

    async def _catch_up(self, request: ChatRequest, route: RolloutRoute) -> None:
        """Refill the rollout's token cache from the store if the conversation holds turns it has not seen."""
        if self.history is None or route.cache_key is None or route.rollout_id is None:
            return
        cache = self.token_caches.get(route.cache_key)
        if not self.codec.knows_every_response(request.messages, cache):
            await self.history.catch_up(cache, route.rollout_id, route.attempt_id)

    def _encode(self, request: ChatRequest, route: RolloutRoute) -> PromptEncoding:
        cache = None if route.cache_key is None else self.token_caches.get(route.cache_key)
        try:
            prompt = self.codec.encode_normalized(
                request.messages, request.tools, token_cache=cache, chat_template_kwargs=request.chat_template_kwargs
            )
        except ChatFormatError as error:
            raise RequestError(str(error), error.param) from None
        if len(prompt.token_ids) >= self.sampler.max_context:
            too_long = ContextLengthError(len(prompt.token_ids), self.sampler.max_context)
            raise RequestError(str(too_long), "messages", code="context_length_exceeded")
        return prompt

    async def _finish(
        self,
        request: ChatRequest,
        route: RolloutRoute,
        prompt: PromptEncoding,
        sampled: SampleResult,
        started: float,
        streamers: Sequence[ChoiceStreamer] = (),
    ) -> ChatResult:
        choices = []
        for index, sequence in enumerate(sampled.sequences):
            message = self.codec.decode_response(
                sequence.tokens, sequence.stop_reason, stop_strings=request.stop_strings
            )
            if not request.parse_tool_calls and message.tool_calls:
                message = AssistantMessage(
                    message.text, [], "stop" if sequence.stop_reason == "stop" else "length", message.text
                )
            choices.append(ChoiceResult(index, message, sequence))
        if request.top_logprobs:
            await self._add_top_logprobs(prompt.token_ids, choices, request.top_logprobs)
        result = ChatResult(list(sampled.prompt_tokens), choices, prompt)
        cache = None if route.cache_key is None else self.token_caches.get(route.cache_key)
        if cache is not None:
            for choice in choices:
                cache.remember(choice.sequence.tokens, prompt_token_ids=result.prompt_token_ids)
        result.sequences = await self.recorder.record(request, route, self.model_name, result, started)
        if cache is not None:
            recorded(cache, result.sequences)
        for streamer, choice in zip(streamers, choices, strict=False):
            streamer.finish(choice.message)
            result.final_pieces.append(streamer.final_piece())
        return result

    async def _add_top_logprobs(self, prompt_ids: list[int], choices: list[ChoiceResult], k: int) -> None:
        scorer = getattr(self.sampler, "compute_top_logprobs_async", None)
        if scorer is None:
            raise RequestError("this sampler backend cannot return top_logprobs", "top_logprobs")
        for choice in choices:
            if choice.sequence.tokens:
                full = prompt_ids + choice.sequence.tokens
                choice.top_logprobs = await scorer(full, k, start=len(prompt_ids))


def _is_named_tool_choice(value: object) -> bool:
    return (
        isinstance(value, dict)
        and value.get("type") == "function"
        and isinstance(value.get("function"), dict)
        and isinstance(value["function"].get("name"), str)
    )


def _or_default(body: Mapping[str, Any], name: str, default: object) -> object:
    """The field's value, or `default` when it is absent or null (as OpenAI clients send it)."""
    value = body.get(name)
    return default if value is None else value


def _int_field(name: str, value: object, *, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise RequestError(f"{name} must be an integer >= {minimum}, got {value!r}", name)
    return value


def _number_field(body: Mapping[str, Any], name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise RequestError(f"{name} must be a number, got {value!r}", name)
    return float(value)


def _stop_strings(stop: object) -> tuple[str, ...]:
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise RequestError("stop must be a non-empty string or a list of non-empty strings", "stop")
    return tuple(items)
