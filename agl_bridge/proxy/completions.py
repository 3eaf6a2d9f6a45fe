"""`POST /v1/completions` with token-id prompts, answered the way vLLM's server answers.

LiteLLM's own completions route cannot take a token-id prompt, so this route sits in front of it.
It is the token-level protocol remote samplers speak: `prompt` is a list of ids (or text, or a
list of either), and with `"return_token_ids": true` each choice carries `prompt_token_ids` and
`token_ids`. vLLM extensions `top_k`, `stop_token_ids`, `ignore_eos` and `prompt_logprobs` (each
prompt token's raw logprob, as vLLM answers it) are accepted. Every choice is recorded like a chat
call, with no messages, unless the request says its caller records it (a `RemoteSampler` in another
proxy sends `x-agl-recorded-upstream`). `model` may also name a LoRA adapter loaded with
`/v1/load_lora_adapter`.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from agl_bridge import semconv
from agl_bridge.proxy.request import RequestError, RolloutRoute, route_of_headers
from agl_bridge.proxy.service import ChatService
from agl_bridge.sampler.base import ContextLengthError, SamplingParamError, SamplingParams

DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for this endpoint


def make_completions_router(service_for: Callable[[str], ChatService]) -> APIRouter:
    """A router with `POST /v1/completions` (and `/completions`) over the registered services.

    Refusals are raised (`RequestError`, and the store's and remote sampler's errors): the app
    serving the router answers them through `agl_bridge.proxy.errors`.
    """
    router = APIRouter()

    async def completions(request: Request) -> JSONResponse:
        body = await read_json_object(request)
        service = service_for(str(body.get("model", "")))
        record = semconv.HEADER_RECORDED_UPSTREAM not in request.headers
        return JSONResponse(await _complete(service, body, route_of_headers(request.headers), record=record))

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


async def _complete(service: ChatService, body: dict[str, Any], route: RolloutRoute, *, record: bool) -> dict[str, Any]:
    started = time.time()
    prompts = _prompts(service, body.get("prompt"))
    params = _params(service, body)
    n = body.get("n", 1)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= service.max_samples_per_request:
        raise RequestError(f"n must be an integer in 1..{service.max_samples_per_request}, got {n!r}", "n")
    want_logprobs = body.get("logprobs")
    if want_logprobs is not None and (
        not isinstance(want_logprobs, int) or isinstance(want_logprobs, bool) or want_logprobs < 0
    ):
        raise RequestError(f"logprobs must be a non-negative integer or null, got {want_logprobs!r}", "logprobs")
    prompt_logprobs = body.get("prompt_logprobs")
    if prompt_logprobs is not None and (
        not isinstance(prompt_logprobs, int) or isinstance(prompt_logprobs, bool) or prompt_logprobs < 0
    ):
        raise RequestError(
            f"prompt_logprobs must be a non-negative integer or null, got {prompt_logprobs!r}", "prompt_logprobs"
        )
    return_ids = bool(body.get("return_token_ids", False))
    tokenizer = service.codec.tokenizer
    choices: list[dict[str, Any]] = []
    prompt_total, completion_total = 0, 0
    for prompt_ids in prompts:
        try:
            sampled = await service.sampler.sample_async(prompt_ids, params, n)
        except ContextLengthError as error:
            raise RequestError(str(error), "prompt", code="context_length_exceeded") from None
        if record:
            await service.recorder.record_completion(
                route,
                model=service.model_name,
                prompt_token_ids=prompt_ids,
                sampled=sampled,
                started=started,
                tokenizer=tokenizer,
            )
        prompt_total += len(prompt_ids)
        scored = None if prompt_logprobs is None else await _prompt_logprobs(service, prompt_ids)
        for sequence in sampled.sequences:
            completion_total += len(sequence.tokens)
            text = tokenizer.decode(sequence.tokens, skip_special_tokens=True)
            choice: dict[str, Any] = {
                "index": len(choices),
                "text": text,
                "finish_reason": sequence.stop_reason,
                "logprobs": None,
                "stop_reason": None,
            }
            if want_logprobs is not None:
                choice["logprobs"] = {
                    "tokens": [_token_text(tokenizer, t) for t in sequence.tokens],
                    "token_logprobs": list(sequence.logprobs),
                    "top_logprobs": None,
                    "text_offset": None,
                }
            if scored is not None:
                choice["prompt_logprobs"] = scored
            if return_ids:
                choice["prompt_token_ids"] = list(prompt_ids)
                choice["token_ids"] = list(sequence.tokens)
                choice["token_policy_versions"] = list(sequence.token_policy_versions)
            choices.append(choice)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(started),
        "model": service.model_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_total,
            "completion_tokens": completion_total,
            "total_tokens": prompt_total + completion_total,
        },
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


def _params(service: ChatService, body: dict[str, Any]) -> SamplingParams:
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise RequestError("stop must be a string or a list of strings", "stop")
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
        raise RequestError("stop_token_ids must be a list of integers", "stop_token_ids")
    eos = [] if body.get("ignore_eos") else list(service.codec.stop_token_ids)
    params = SamplingParams(
        max_tokens=body.get("max_tokens", DEFAULT_MAX_TOKENS),
        temperature=body.get("temperature", 1.0),
        top_p=body.get("top_p", 1.0),
        top_k=body.get("top_k", -1),
        stop=[*eos, *stop_ids, *stop],
        seed=body.get("seed"),
    )
    try:
        params.validate(getattr(service.sampler, "vocab_size", None))
    except SamplingParamError as error:
        raise RequestError(str(error), error.field) from None
    return params
