"""Serving an OpenAI chat request from a token sampler and recording it exactly.

This is the proxy's core, kept free of LiteLLM and HTTP so that it can be called, tested and timed
on its own: parse and validate the request body, encode the messages to prompt ids (re-using the
rollout's sampled ids), sample, decode, and commit one `LLMCall` per choice to the store before the
response is handed back. `agl_bridge.proxy.provider` adapts it to LiteLLM.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from agl_bridge.chat import (
    AssistantMessage,
    ChatCodec,
    ChatFormatError,
    PromptEncoding,
    PromptTooLongError,
    TokenCacheRegistry,
    normalize_messages,
    normalize_tools,
)
from agl_bridge.proxy.recording import CallRecorder
from agl_bridge.proxy.request import (
    ChatRequest,
    ChatResult,
    ChoiceResult,
    RequestError,
    RolloutRoute,
    declared_class,
    flag_field,
    or_default,
)
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
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "default")
"""OpenAI's `reasoning_effort` values; any but "none" turns the chat template's thinking switch on."""
THINKING_SWITCH = "enable_thinking"
"""The chat-template variable that turns a model's thinking on or off (Qwen3's and others')."""
PASSED_FIELDS = ("reasoning_effort", "thinking")
"""Fields LiteLLM's parameter check would refuse for our provider that `parse_request` decides on itself."""

UNHONOURED_FIELDS: dict[str, object] = {
    "logit_bias": {},
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "repetition_penalty": 1,
    "min_p": 0,
    "min_tokens": 0,
    "prediction": None,
    "audio": None,
    "web_search_options": None,
}
"""Sampling fields the sampler does not implement, with the value that asks for nothing (null too).

A request that sets one to anything else is refused naming the field: sampling as if it were
absent would be silently wrong (and the recorded logprobs would not be the distribution asked for)."""
ENCODE_OFF_LOOP_CHARS = 8192
"""Prompts with more characters of text than this are rendered and tokenized in a worker thread.

Tokenizing costs about 0.35 µs per character with the tiny model's tokenizer (3 ms at 8k), so
larger prompts would hold up every other request on the event loop; the hand-off to a thread
costs more than tokenizing a small prompt, so small ones stay on the loop."""


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
        self.thinking_switch = THINKING_SWITCH in str(getattr(codec.tokenizer, "chat_template", None) or "")
        """Whether the chat template has a thinking switch that reasoning fields turn on or off."""

    # ------------------------------------------------------------------ parsing

    def parse_request(self, body: Mapping[str, Any]) -> ChatRequest:
        """Validate an OpenAI chat-completions body; RequestError names the offending field."""
        check_response_format(body)
        refuse_unhonoured(body)
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
        n = _int_field("n", or_default(body, "n", 1), minimum=1)
        if n > self.max_samples_per_request:
            raise RequestError(f"n must be at most {self.max_samples_per_request}, got {n}", "n")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        max_tokens = self.default_max_tokens if max_tokens is None else _int_field("max_tokens", max_tokens, minimum=1)
        stop_strings = _stop_strings(body.get("stop"))
        logprobs = flag_field(body, "logprobs")
        top_logprobs = _int_field("top_logprobs", or_default(body, "top_logprobs", 0), minimum=0)
        if top_logprobs > MAX_TOP_LOGPROBS:
            raise RequestError(f"top_logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {top_logprobs}", "top_logprobs")
        if top_logprobs and not logprobs:
            raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
        template_kwargs = body.get("chat_template_kwargs")
        if template_kwargs is not None and not isinstance(template_kwargs, dict):
            raise RequestError("chat_template_kwargs must be an object", "chat_template_kwargs")
        thinking = reasoning_switch(body)
        if thinking is not None and self.thinking_switch and THINKING_SWITCH not in (template_kwargs or {}):
            template_kwargs = {**(template_kwargs or {}), THINKING_SWITCH: thinking}
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=_number_field(body, "temperature", 1.0),
            top_p=_number_field(body, "top_p", 1.0),
            top_k=_int_field("top_k", or_default(body, "top_k", -1), minimum=-1),
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
            return_token_ids=flag_field(body, "return_token_ids"),
            chat_template_kwargs=template_kwargs,
            text_chars=_text_chars(messages, tools),
        )

    # ------------------------------------------------------------------ serving

    async def complete(self, request: ChatRequest, route: RolloutRoute, *, started: float | None = None) -> ChatResult:
        """Sample all choices, record them durably, and return the result (`started`: the recorded start time)."""
        started = time.time() if started is None else started
        declared_class(route)  # a class that is not one of ours is refused before anything is sampled
        await self._catch_up(request, route)
        prompt = await self._encode(request, route)
        try:
            sampled = await self.sampler.sample_async(prompt.token_ids, request.params, request.n)
        except ContextLengthError as error:
            raise RequestError(str(error), "messages", code="context_length_exceeded") from None
        return await self._finish(request, route, prompt, sampled, started)

    async def stream(
        self, request: ChatRequest, route: RolloutRoute, *, started: float | None = None
    ) -> AsyncIterator[PromptEncoding | StreamDelta | ChatResult]:
        """Yield the prompt encoding, text deltas per choice as tokens are sampled, then the
        recorded ChatResult (whose `final_pieces` hold what each choice has left to send).

        Text that could still turn into a stop string or a `<tool_call>` block is held back until
        it is certain, so the deltas joined are exactly the final message content.
        """
        started = time.time() if started is None else started
        declared_class(route)
        await self._catch_up(request, route)
        prompt = await self._encode(request, route)
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

    async def count_prompt_tokens(self, request: ChatRequest, route: RolloutRoute) -> int:
        """How many tokens the request's prompt is, encoded exactly as `complete` would encode it (nothing sampled
        or recorded)."""
        declared_class(route)
        await self._catch_up(request, route)
        return len((await self._encode(request, route)).token_ids)

    async def _catch_up(self, request: ChatRequest, route: RolloutRoute) -> None:
        """Refill the rollout's token cache from the store if the conversation holds turns it has not seen."""
        if self.history is None or route.cache_key is None or route.rollout_id is None:
            return
        cache = self.token_caches.get(route.cache_key)
        if not self.codec.knows_every_response(request.messages, cache):
            await self.history.catch_up(cache, route.rollout_id, route.attempt_id)

    async def _encode(self, request: ChatRequest, route: RolloutRoute) -> PromptEncoding:
        """The prompt's ids; a large prompt is encoded in a worker thread, one that cannot fit is refused
        by its length before it is tokenized."""
        if request.text_chars > ENCODE_OFF_LOOP_CHARS:
            return await asyncio.to_thread(self._encode_now, request, route)
        return self._encode_now(request, route)

    def _encode_now(self, request: ChatRequest, route: RolloutRoute) -> PromptEncoding:
        cache = None if route.cache_key is None else self.token_caches.get(route.cache_key)
        try:
            prompt = self.codec.encode_normalized(
                request.messages,
                request.tools,
                token_cache=cache,
                chat_template_kwargs=request.chat_template_kwargs,
                max_tokens=self.sampler.max_context - 1,
            )
        except PromptTooLongError as error:
            raise RequestError(str(error), "messages", code="context_length_exceeded") from None
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
                    message.text,
                    [],
                    "stop" if sequence.stop_reason == "stop" else "length",
                    message.text,
                    stop_string=message.stop_string,
                )
            choices.append(ChoiceResult(index, message, sequence))
        if request.top_logprobs:
            await self._add_top_logprobs(prompt.token_ids, choices, request.top_logprobs)
        result = ChatResult(list(sampled.prompt_tokens), choices, prompt)
        result.sequences = await self.recorder.record(request, route, self.model_name, result, started)
        cache = None if route.cache_key is None else self.token_caches.get(route.cache_key)
        if cache is not None:
            # Remembered once recorded, with the call's store sequence: later requests say which
            # answers they carry (`PromptEncoding.carries`). The response is not returned before this.
            for choice, stored in zip(choices, result.sequences, strict=False):
                cache.remember(
                    choice.sequence.tokens, prompt_token_ids=result.prompt_token_ids, call=(stored, choice.index)
                )
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


def check_response_format(body: Mapping[str, Any]) -> None:
    """Refuse a `response_format` that is not an object with a `type` (LiteLLM answers it with a 500)."""
    response_format = body.get("response_format")
    if response_format is not None and not (
        isinstance(response_format, dict) and isinstance(response_format.get("type"), str)
    ):
        message = f'response_format must be an object like {{"type": "json_object"}}, got {response_format!r:.100}'
        raise RequestError(message, "response_format")


def _asks_for_nothing(value: object, neutral: object) -> bool:
    """Whether a field's value asks for nothing: null, the neutral value, or an object of nulls (what
    LiteLLM's Responses bridge makes of a hosted `web_search` tool that Codex CLI always lists)."""
    if isinstance(value, dict) and value and all(item is None for item in value.values()):
        return True
    return value is None or value == neutral


def refuse_unhonoured(body: Mapping[str, Any]) -> None:
    """Refuse a request that sets a sampling field the sampler does not implement (`UNHONOURED_FIELDS`)."""
    for name, neutral in UNHONOURED_FIELDS.items():
        value = body.get(name)
        if not _asks_for_nothing(value, neutral):
            raise RequestError(
                f"{name} is not supported by this server's sampler (got {value!r:.100}); remove it"
                + ("" if neutral is None else f" or set it to {neutral!r}"),
                name,
                code="unsupported_parameter",
            )


def reasoning_switch(body: Mapping[str, Any]) -> bool | None:
    """Whether the request asks for reasoning (True), asks for none (False), or does not say (None).

    Read from OpenAI's `reasoning_effort` (LiteLLM's bridges map the Responses API's
    `reasoning.effort` and Anthropic's `thinking` onto it) or Anthropic's `thinking` itself.
    """
    effort = body.get("reasoning_effort")
    if isinstance(effort, dict):  # a Responses `reasoning` object passed on whole
        effort = effort.get("effort")
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise RequestError(
                f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r:.100}",
                "reasoning_effort",
            )
        return effort != "none"
    thinking = body.get("thinking")
    if thinking is None:
        return None
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind not in ("enabled", "disabled", "adaptive"):
        message = (
            f'thinking must be an object like {{"type": "enabled"}} or {{"type": "disabled"}}, got {thinking!r:.100}'
        )
        raise RequestError(message, "thinking")
    return kind != "disabled"


def _text_chars(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    """About how many characters of text the prompt will have (what its encoding costs grows with)."""
    total = len(json.dumps(tools)) if tools else 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(part.get("text") or "") for part in content if isinstance(part, dict))
        for call in message.get("tool_calls") or ():
            total += len(str(call.get("function", {}).get("arguments") or ""))
    return total


def _is_named_tool_choice(value: object) -> bool:
    return (
        isinstance(value, dict)
        and value.get("type") == "function"
        and isinstance(value.get("function"), dict)
        and isinstance(value["function"].get("name"), str)
    )


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
