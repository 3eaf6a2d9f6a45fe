"""vLLM's token protocol on `POST /v1/completions`: the request we send and the checks on the answer.

Request: `prompt` is a list of token ids; `max_tokens` is always a number (vLLM reads `null` as its
default of 16 tokens, while our `max_tokens=None` means "up to the context window", so the room left
in the server's window is sent); `return_token_ids: true` asks for `prompt_token_ids` and
`token_ids` on every choice, `logprobs: 0` for the sampled tokens' logprobs only; `top_k`,
`stop_token_ids` and `ignore_eos` are vLLM's extra parameters. Our `stop=None` means "the model's
end-of-sequence ids" (the server's default); any explicit stop list replaces them, so it is sent with
`ignore_eos: true` and the ids as `stop_token_ids`.

Answer: every choice must carry `token_ids`, `prompt_token_ids` equal to the ids sent, and one
logprob per token in `logprobs.token_logprobs` (position i is the logprob of `token_ids[i]`;
`logprobs.tokens` holds text and is never used). Anything missing is an error naming the field —
a call is never recorded without its ids. Nothing is detokenized or re-tokenized here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from agl_bridge.sampler.base import SampledSequence, SampleResult, SamplingParams
from agl_bridge.sampler.remote_errors import ServerFailure

_FINISH_REASONS = {"stop": "stop", "length": "length"}


def completion_body(
    model: str, prompt: Sequence[int], params: SamplingParams, num_samples: int, context_window: int
) -> dict[str, Any]:
    """The `/v1/completions` body that samples `num_samples` continuations of `prompt` as `params` say.

    context_window: the server's `max_model_len`; no sequence is asked to grow past it.
    """
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt),
        "n": num_samples,
        "max_tokens": params.token_budget(len(prompt), context_window),
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "logprobs": 0,
        "return_token_ids": True,
    }
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop is not None:
        body["ignore_eos"] = True
        body["stop_token_ids"] = list(params.stop_token_ids)
        body["stop"] = list(params.stop_strings)
    return body


def served_context_window(answer: Any, model: str) -> int:
    """The `max_model_len` a `/v1/models` answer gives for `model` (or for its only base model); 0 if none.

    vLLM lists the base model (`parent: null`) and each loaded LoRA adapter (`parent`: the base) with
    the engine's `max_model_len`; an `agl-bridge serve` (LiteLLM's list) gives none.
    """
    entries = answer.get("data") if isinstance(answer, Mapping) else None
    if not isinstance(entries, list):
        return 0
    entries = [e for e in entries if isinstance(e, Mapping) and _is_int(e.get("max_model_len"))]
    named = [e for e in entries if e.get("id") == model]
    bases = [e for e in entries if e.get("parent") is None]
    chosen = named or (bases if len(bases) == 1 else [])
    return int(chosen[0]["max_model_len"]) if chosen else 0


def listed_adapters(answer: Any, model: str) -> dict[str, tuple[int, str]]:
    """The policy adapters a `/v1/models` answer lists for `model`: `<model>-v<N>` → (N, its folder).

    vLLM lists each LoRA adapter loaded with `/v1/load_lora_adapter` as an entry whose `parent` is
    the base model and whose `root` is the folder it was loaded from; other entries (the base model,
    adapters of other names or of another base) are left out. A missing `root` gives "".
    """
    entries = answer.get("data") if isinstance(answer, Mapping) else None
    if not isinstance(entries, list):
        return {}
    versioned = re.compile(rf"{re.escape(model)}-v(\d+)")
    found: dict[str, tuple[int, str]] = {}
    for entry in entries:
        if not isinstance(entry, Mapping) or entry.get("parent") != model or not isinstance(entry.get("id"), str):
            continue
        match = versioned.fullmatch(entry["id"])
        if match is not None:
            root = entry.get("root")
            found[entry["id"]] = (int(match[1]), root if isinstance(root, str) else "")
    return found


def scoring_body(model: str, token_ids: Sequence[int]) -> dict[str, Any]:
    """A body whose answer holds the raw logprob of every token of `token_ids` (`prompt_logprobs`)."""
    return {
        "model": model,
        "prompt": list(token_ids),
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 0,
        "return_token_ids": True,
        "ignore_eos": True,
    }


def parse_completion(url: str, answer: Any, prompt: Sequence[int], num_samples: int, version: int) -> SampleResult:
    """The SampleResult in a `/v1/completions` answer; ServerFailure naming what is missing or wrong.

    Tokens get the server's `token_policy_versions` when it sends them (agl-bridge serve does), else
    `version`: the version of the adapter the request named, which vLLM uses for the whole request.
    """
    choices = _choices(url, answer, num_samples)
    sequences = []
    for position, choice in enumerate(choices):
        where = f"choices[{position}]"
        tokens = _int_list(url, choice.get("token_ids"), f"{where}.token_ids")
        prompt_ids = choice.get("prompt_token_ids", answer.get("prompt_token_ids"))
        if prompt_ids is None:
            raise _missing(url, f"{where}.prompt_token_ids")
        if list(prompt_ids) != list(prompt):
            raise ServerFailure(
                url,
                f"{where}.prompt_token_ids differ from the prompt ids sent ({len(prompt_ids)} vs {len(prompt)} ids): "
                "the "
                "server changed the prompt (added special tokens?), so its tokens cannot be trained on",
            )
        logprobs = _token_logprobs(url, choice.get("logprobs"), where, len(tokens))
        reason = _FINISH_REASONS.get(choice.get("finish_reason"))  # type: ignore[arg-type]
        if reason is None:
            raise ServerFailure(
                url, f"{where}.finish_reason is {choice.get('finish_reason')!r}; expected 'stop' or 'length'"
            )
        versions = choice.get("token_policy_versions")
        if isinstance(versions, list) and len(versions) == len(tokens) and all(_is_int(v) for v in versions):
            token_versions = [int(v) for v in versions]
        else:
            token_versions = [version] * len(tokens)
        sequences.append(SampledSequence(tokens, logprobs, reason, token_versions))  # type: ignore[arg-type]
    return SampleResult(list(prompt), sequences)


def parse_prompt_logprobs(url: str, answer: Any, token_ids: Sequence[int]) -> list[float | None]:
    """The raw logprob of each of `token_ids` from an answer to `scoring_body` (the first is None)."""
    choice = _choices(url, answer, 1)[0]
    entries = choice.get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) != len(token_ids):
        raise _missing(url, f"choices[0].prompt_logprobs (one entry per prompt token, {len(token_ids)})")
    out: list[float | None] = [None]
    for position in range(1, len(token_ids)):
        entry = entries[position]
        scored = entry.get(str(token_ids[position])) if isinstance(entry, Mapping) else None
        value = scored.get("logprob") if isinstance(scored, Mapping) else scored
        if not _is_number(value):
            raise _missing(url, f"choices[0].prompt_logprobs[{position}][{token_ids[position]!r}].logprob")
        out.append(float(value))  # type: ignore[arg-type]
    return out


def error_message(answer: Any, fallback: str) -> tuple[str, str | None, str | None]:
    """(message, param, code) of an OpenAI-style or vLLM error body; `fallback` when it has none."""
    error = answer.get("error", answer) if isinstance(answer, Mapping) else None
    if isinstance(error, Mapping) and isinstance(error.get("message"), str):
        param, code = error.get("param"), error.get("code")
        return error["message"], param if isinstance(param, str) else None, code if isinstance(code, str) else None
    return fallback, None, None


def _choices(url: str, answer: Any, expected: int) -> list[Mapping[str, Any]]:
    if not isinstance(answer, Mapping) or not isinstance(answer.get("choices"), list):
        raise _missing(url, "choices")
    choices = answer["choices"]
    if len(choices) != expected or not all(isinstance(c, Mapping) for c in choices):
        raise ServerFailure(url, f"answered with {len(choices)} choices for n={expected}")
    return sorted(choices, key=lambda c: c.get("index", 0) if _is_int(c.get("index")) else 0)


def _int_list(url: str, value: Any, name: str) -> list[int]:
    if not isinstance(value, list) or not all(_is_int(t) for t in value):
        raise _missing(url, name)
    return [int(t) for t in value]


def _token_logprobs(url: str, logprobs: Any, where: str, count: int) -> list[float]:
    values = logprobs.get("token_logprobs") if isinstance(logprobs, Mapping) else None
    if not isinstance(values, list) or len(values) != count:
        got = "nothing" if not isinstance(values, list) else f"{len(values)} values"
        raise ServerFailure(
            url,
            f"answered without {where}.logprobs.token_logprobs for each of its {count} token_ids (got {got}); "
            "the request asks for logprobs: 0",
        )
    if not all(_is_number(v) for v in values):
        raise ServerFailure(url, f"{where}.logprobs.token_logprobs holds a value that is not a number")
    return [float(v) for v in values]


def _missing(url: str, name: str) -> ServerFailure:
    return ServerFailure(
        url,
        f"answered /v1/completions without {name}; the server must speak vLLM's token protocol "
        "(vLLM >= 0.10.2 with return_token_ids, or agl-bridge serve)",
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
