"""`POST /v1/completions` with text or token-id prompts, answered the way vLLM's server answers.

LiteLLM's own completions route cannot take a token-id prompt, so this route sits in front of it.
It is the token-level protocol remote samplers speak: `prompt` is a list of ids (or text, or a
list of either), and with `"return_token_ids": true` each choice carries `prompt_token_ids` and
`token_ids`. vLLM extensions `top_k`, `stop_token_ids`, `ignore_eos` and `prompt_logprobs` (each
prompt token's raw logprob, as vLLM answers it) are accepted. `stream: true` answers OpenAI's
completion chunks (with `stream_options.include_usage`, a last chunk with no choices carries the
usage; then `[DONE]`); a field not in `KNOWN_FIELDS` is refused naming it, as OpenAI does. Every
choice is recorded like a chat call, with no messages, unless the request says its caller records
it (a `RemoteSampler` in another proxy sends `x-agl-recorded-upstream`). `model` may also name a
LoRA adapter loaded with `/v1/load_lora_adapter`.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from agl_bridge import semconv
from agl_bridge.proxy.errors import api_error, error_body
from agl_bridge.proxy.request import (
    RequestError,
    RolloutRoute,
    declared_class,
    flag_field,
    or_default,
    route_of_headers,
)
from agl_bridge.proxy.service import ChatService, refuse_unhonoured
from agl_bridge.proxy.sse import SSE_DONE, SSE_HEADERS, sse_data, stream_options
from agl_bridge.sampler.base import (
    ContextLengthError,
    SampleResult,
    SamplingParamError,
    SamplingParams,
    TokenEvent,
    stream_tokens,
)

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for this endpoint


def make_completions_router(service_for: Callable[[str], ChatService]) -> APIRouter:
    """A router with `POST /v1/completions` (and `/completions`) over the registered services.

    Refusals are raised (`RequestError`, and the store's and remote sampler's errors): the app
    serving the router answers them through `agl_bridge.proxy.errors`.
    """
    router = APIRouter()

    async def completions(request: Request) -> Response:
        body = await read_json_object(request)
        service = service_for(str(body.get("model", "")))
        record = semconv.HEADER_RECORDED_UPSTREAM not in request.headers
        route = route_of_headers(request.headers)
        declared_class(route)  # a class that is not one of ours is refused before anything is sampled
        parsed = _parse(service, body)
        if not parsed.stream:
            return JSONResponse(await _complete(service, parsed, route, record=record))
        chunks = _stream(service, parsed, route, record=record)
        first = await anext(chunks)  # a failure before the first chunk is a plain error with its status
        return StreamingResponse(_events(first, chunks), media_type="text/event-stream", headers=SSE_HEADERS)

    for path in ("/v1/completions", "/completions"):
        router.add_api_route(path, completions, methods=["POST"], include_in_schema=True)
    return router


async def read_json_object(request: Request) -> dict[str, Any]:
    """The request's JSON body, which must be an object; a `RequestError` naming `request_body` if not."""
    try:
        body = await request.json()
    except ValueError:
        raise RequestError("the request body is not valid JSON", "request_body") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object", "request_body")
    return body


KNOWN_FIELDS = frozenset(
    {
        # OpenAI's
        "model", "prompt", "max_tokens", "n", "temperature", "top_p", "stop", "seed", "logprobs", "stream",
        "stream_options", "user", "best_of", "echo", "suffix", "logit_bias", "presence_penalty", "frequency_penalty",
        # vLLM's
        "top_k", "stop_token_ids", "ignore_eos", "prompt_logprobs", "return_token_ids", "min_p", "min_tokens",
        "repetition_penalty",
    }
)  # fmt: skip
"""The fields a completions request may have; any other is refused naming it (OpenAI refuses them too)."""

_NEUTRAL = {"best_of": 1, "echo": False, "suffix": None}
"""OpenAI's completions fields we accept only with the value that asks for nothing."""


@dataclass
class _Completion:
    """A validated completions request."""

    prompts: list[list[int]]
    params: SamplingParams
    n: int
    logprobs: int | None
    prompt_logprobs: int | None
    return_ids: bool
    stream: bool
    include_usage: bool


def _parse(service: ChatService, body: dict[str, Any]) -> _Completion:
    unknown = sorted(set(body) - KNOWN_FIELDS)
    if unknown:
        raise RequestError(
            f"unknown field {unknown[0]!r} in a completions request; accepted: {', '.join(sorted(KNOWN_FIELDS))}",
            unknown[0],
            code="unknown_parameter",
        )
    refuse_unhonoured(body)
    for name, neutral in _NEUTRAL.items():
        if body.get(name) not in (None, neutral):
            message = f"{name} is not supported by this server (got {body[name]!r:.100}); remove it"
            raise RequestError(message, name, code="unsupported_parameter")
    prompts = _prompts(service, body.get("prompt"))
    params = _params(service, body)
    n = body.get("n", 1)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= service.max_samples_per_request:
        raise RequestError(f"n must be an integer in 1..{service.max_samples_per_request}, got {n!r}", "n")
    stream, include_usage = stream_options(body)
    prompt_logprobs = _optional_count(body, "prompt_logprobs")
    if stream and prompt_logprobs is not None:
        raise RequestError("prompt_logprobs cannot be streamed; send stream: false", "prompt_logprobs")
    return _Completion(
        prompts,
        params,
        n,
        _optional_count(body, "logprobs"),
        prompt_logprobs,
        flag_field(body, "return_token_ids"),
        stream,
        include_usage,
    )


def _optional_count(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise RequestError(f"{name} must be a non-negative integer or null, got {value!r:.100}", name)
    return value


async def _sample(service: ChatService, prompt_ids: list[int], request: _Completion) -> SampleResult:
    try:
        return await service.sampler.sample_async(prompt_ids, request.params, request.n)
    except ContextLengthError as error:
        raise RequestError(str(error), "prompt", code="context_length_exceeded") from None


async def _record(
    service: ChatService, route: RolloutRoute, prompt_ids: list[int], sampled: SampleResult, started: float
) -> None:
    await service.recorder.record_completion(
        route,
        model=service.model_name,
        prompt_token_ids=prompt_ids,
        sampled=sampled,
        started=started,
        tokenizer=service.codec.tokenizer,
    )


async def _complete(service: ChatService, request: _Completion, route: RolloutRoute, *, record: bool) -> dict[str, Any]:
    started = time.time()
    tokenizer = service.codec.tokenizer
    choices: list[dict[str, Any]] = []
    prompt_total, completion_total = 0, 0
    for prompt_ids in request.prompts:
        sampled = await _sample(service, prompt_ids, request)
        if record:
            await _record(service, route, prompt_ids, sampled, started)
        prompt_total += len(prompt_ids)
        scored = None if request.prompt_logprobs is None else await _prompt_logprobs(service, prompt_ids)
        for sequence in sampled.sequences:
            completion_total += len(sequence.tokens)
            text = tokenizer.decode(sequence.tokens, skip_special_tokens=True)
            choice = _choice(len(choices), text, sequence.stop_reason)
            if request.logprobs is not None:
                choice["logprobs"] = _logprobs(tokenizer, sequence.tokens, sequence.logprobs)
            if scored is not None:
                choice["prompt_logprobs"] = scored
            if request.return_ids:
                choice["prompt_token_ids"] = list(prompt_ids)
                choice["token_ids"] = list(sequence.tokens)
                choice["token_policy_versions"] = list(sequence.token_policy_versions)
            choices.append(choice)
    return {
        **_envelope(f"cmpl-{uuid.uuid4().hex}", started, service.model_name),
        "choices": choices,
        "usage": _usage(prompt_total, completion_total),
    }


async def _stream(
    service: ChatService, request: _Completion, route: RolloutRoute, *, record: bool
) -> AsyncIterator[dict[str, Any]]:
    """OpenAI's completion chunks: text as it is sampled (prompt after prompt, each prompt's `n` choices
    interleaved), each choice's last chunk with its `finish_reason`, then the usage chunk if asked for."""
    started = time.time()
    envelope = _envelope(f"cmpl-{uuid.uuid4().hex}", started, service.model_name)
    tokenizer = service.codec.tokenizer
    prompt_total, completion_total = 0, 0
    for number, prompt_ids in enumerate(request.prompts):
        first_index = number * request.n
        decoders = [service.codec.incremental_decoder(skip_special_tokens=True) for _ in range(request.n)]
        pending: list[list[tuple[int, float]]] = [[] for _ in range(request.n)]
        sampled: SampleResult | None = None
        try:
            async for item in stream_tokens(service.sampler, prompt_ids, request.params, request.n):
                if not isinstance(item, TokenEvent):
                    sampled = item
                    continue
                pending[item.sample_index].append((item.token, item.logprob))
                text = decoders[item.sample_index].push(item.token)
                if text:
                    tokens = pending[item.sample_index]
                    pending[item.sample_index] = []
                    yield {
                        **envelope,
                        "choices": [
                            _chunk_choice(tokenizer, request, first_index + item.sample_index, text, tokens, prompt_ids)
                        ],
                    }
        except ContextLengthError as error:
            raise RequestError(str(error), "prompt", code="context_length_exceeded") from None
        assert sampled is not None
        if record:
            await _record(service, route, prompt_ids, sampled, started)
        prompt_total += len(prompt_ids)
        for index, sequence in enumerate(sampled.sequences):
            completion_total += len(sequence.tokens)
            last = _chunk_choice(
                tokenizer, request, first_index + index, decoders[index].finish(), pending[index], prompt_ids
            )
            last["finish_reason"] = sequence.stop_reason
            yield {**envelope, "choices": [last]}
    if request.include_usage:
        yield {**envelope, "choices": [], "usage": _usage(prompt_total, completion_total)}


def _chunk_choice(
    tokenizer: Any,
    request: _Completion,
    index: int,
    text: str,
    tokens: list[tuple[int, float]],
    prompt_ids: list[int],
) -> dict[str, Any]:
    choice = _choice(index, text, None)
    if request.logprobs is not None:
        choice["logprobs"] = _logprobs(tokenizer, [t for t, _ in tokens], [lp for _, lp in tokens])
    if request.return_ids:
        choice["token_ids"] = [t for t, _ in tokens]
        choice["prompt_token_ids"] = list(prompt_ids)
    return choice


def _envelope(completion_id: str, created: float, model: str) -> dict[str, Any]:
    return {"id": completion_id, "object": "text_completion", "created": int(created), "model": model}


def _choice(index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
    return {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": None, "stop_reason": None}


def _logprobs(tokenizer: Any, tokens: list[int], logprobs: list[float]) -> dict[str, Any]:
    return {
        "tokens": [_token_text(tokenizer, t) for t in tokens],
        "token_logprobs": list(logprobs),
        "top_logprobs": None,
        "text_offset": None,
    }


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@functools.lru_cache(maxsize=65536)
def _token_text(tokenizer: Any, token: int) -> str:
    """The text of one token, cached: remote samplers ask for logprobs (hence token texts) on every call."""
    return tokenizer.decode([token])


async def _prompt_logprobs(service: ChatService, prompt_ids: list[int]) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's `prompt_logprobs` with 0 alternatives: per position, the prompt token's raw logprob (None first)."""
    tokenizer = service.codec.tokenizer
    scores = await service.sampler.compute_logprobs_async(prompt_ids)
    return [
        None
        if score is None
        else {str(token): {"logprob": score, "rank": None, "decoded_token": tokenizer.decode([token])}}
        for token, score in zip(prompt_ids, scores, strict=True)
    ]


def _prompts(service: ChatService, prompt: Any) -> list[list[int]]:
    """The prompt(s) as token-id lists: ids are taken as they are, text goes through the tokenizer."""
    if isinstance(prompt, str):
        prompt = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise RequestError("prompt must be a string, a list of token ids, or a non-empty list of either", "prompt")
    out = []
    for item in prompt:
        if isinstance(item, str):
            ids = service.codec.tokenizer(item, add_special_tokens=False)["input_ids"]
        elif isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
            ids = list(item)
        else:
            raise RequestError("each prompt must be a string or a list of integer token ids", "prompt")
        vocab = getattr(service.sampler, "vocab_size", None)
        if not ids:
            raise RequestError("a prompt must contain at least one token", "prompt")
        if vocab is not None and any(t < 0 or t >= vocab for t in ids):
            raise RequestError(f"prompt token ids must be in 0..{vocab - 1}", "prompt")
        out.append(ids)
    return out


async def _events(first: dict[str, Any], chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """Server-sent events: each chunk, then `[DONE]`; a failure mid-stream becomes an `error` event."""
    yield sse_data(first)
    try:
        async for chunk in chunks:
            yield sse_data(chunk)
    except Exception as exc:  # the status is sent already: the error goes in the stream
        error = api_error(exc)
        if error.status >= 500:
            logger.error("streaming a completion failed", exc_info=exc)
        yield sse_data(error_body(error))
        return
    yield SSE_DONE


def _params(service: ChatService, body: dict[str, Any]) -> SamplingParams:
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise RequestError("stop must be a string or a list of strings", "stop")
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
        raise RequestError("stop_token_ids must be a list of integers", "stop_token_ids")
    eos = [] if flag_field(body, "ignore_eos") else list(service.codec.stop_token_ids)
    params = SamplingParams(
        max_tokens=or_default(body, "max_tokens", DEFAULT_MAX_TOKENS),  # null is the default, not "up to the window"
        temperature=or_default(body, "temperature", 1.0),
        top_p=or_default(body, "top_p", 1.0),
        top_k=or_default(body, "top_k", -1),
        stop=[*eos, *stop_ids, *stop],
        seed=body.get("seed"),
    )
    try:
        params.validate(getattr(service.sampler, "vocab_size", None))
    except SamplingParamError as error:
        raise RequestError(str(error), error.field) from None
    return params
