"""The token-level sampler contract: token ids in, token ids + logprobs + stop reason out.

Every backend (in-process Hugging Face, remote vLLM-protocol servers, in-process vLLM) implements
`TokenSampler`. Names and meanings of `SamplingParams` follow Tinker's.

Which distribution the logprobs come from: every logprob a sampler returns is
``log_softmax(raw_logits)[token]`` — the model's own distribution at temperature 1, before
temperature, top-k or top-p are applied (vLLM's "raw_logprobs" mode). The trainer computes its
logprobs the same way, so the two are directly comparable; when sampling at temperature != 1 the
sampling distribution differs from the one scored, which importance-sampling correction does not
undo.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

StopReason = Literal["stop", "length"]


class ContextLengthError(ValueError):
    """A prompt (plus the tokens asked for) does not fit in the model's context window."""

    def __init__(self, prompt_length: int, max_context: int) -> None:
        super().__init__(
            f"prompt has {prompt_length} tokens but the model's context window is {max_context} "
            f"tokens; shorten the prompt to at most {max_context - 1} tokens"
        )
        self.prompt_length = prompt_length
        self.max_context = max_context

    def __reduce__(self) -> tuple[type[ContextLengthError], tuple[int, int]]:  # crosses process boundaries whole
        return type(self), (self.prompt_length, self.max_context)


class SamplingParamError(ValueError):
    """A sampling parameter is out of range; `field` names it (e.g. for an API error's `param`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field

    def __reduce__(self) -> tuple[type[SamplingParamError], tuple[str, str]]:  # crosses process boundaries whole
        return type(self), (self.field, str(self))


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request; Tinker's names and meanings.

    max_tokens: most new tokens to sample (None: until the context window is full).
    temperature: 0 means greedy; otherwise logits are divided by it before sampling.
    top_p: nucleus mass in (0, 1]; 1 disables it.
    top_k: keep the k most likely tokens; -1 (or 0) disables it.
    stop: strings or token ids that end a sequence. None means the model's end-of-sequence ids;
      an empty list means never stop early. A stop token is kept in the sampled tokens (it was
      sampled); a stop string ends the sequence at the token that completes it.
    seed: makes a request reproducible when it runs alone (see the sampler docs on batching).
    """

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: str | Sequence[str | int] | None = None
    seed: int | None = None

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise SamplingParamError naming the field and its allowed range if a value is out of range."""
        if self.max_tokens is not None and (
            not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1
        ):
            raise SamplingParamError(
                "max_tokens", f"max_tokens must be an integer >= 1 (or None), got {self.max_tokens!r}"
            )
        if not _is_finite_number(self.temperature) or self.temperature < 0:
            raise SamplingParamError(
                "temperature", f"temperature must be a finite number >= 0, got {self.temperature!r}"
            )
        if not _is_finite_number(self.top_p) or not 0 < self.top_p <= 1:
            raise SamplingParamError("top_p", f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < -1:
            raise SamplingParamError(
                "top_k", f"top_k must be an integer >= 1, or -1/0 to disable it, got {self.top_k!r}"
            )
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise SamplingParamError("seed", f"seed must be an integer or None, got {self.seed!r}")
        for token_id in self.stop_token_ids:
            if token_id < 0 or (vocab_size is not None and token_id >= vocab_size):
                raise SamplingParamError(
                    "stop", f"stop token id {token_id} is not in the vocabulary (allowed: 0..{(vocab_size or 1) - 1})"
                )
        for text in self.stop_strings:
            if not text:
                raise SamplingParamError("stop", "stop strings must be non-empty")

    def token_budget(self, prompt_length: int, context_window: int) -> int:
        """Most new tokens to sample after a prompt: `max_tokens`, never past the context window.

        None means up to the window. Samplers that take a number (vLLM) are sent this; ours stops
        at the window with "length" the same way.
        """
        room = context_window - prompt_length
        return room if self.max_tokens is None else min(self.max_tokens, room)

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """The stop entries that are strings."""
        if self.stop is None:
            return ()
        if isinstance(self.stop, str):
            return (self.stop,)
        return tuple(s for s in self.stop if isinstance(s, str))

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """The stop entries that are token ids."""
        if self.stop is None or isinstance(self.stop, str):
            return ()
        ids = []
        for s in self.stop:
            if isinstance(s, bool) or not isinstance(s, (int, str)):
                raise SamplingParamError("stop", f"stop entries must be strings or token ids, got {s!r}")
            if isinstance(s, int):
                ids.append(s)
        return tuple(ids)


def _is_finite_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class SampledSequence:
    """One sampled continuation: its token ids, their raw logprobs, and why it stopped.

    `token_policy_versions[i]` is the policy version whose weights produced token i; a weight swap
    during a long sequence shows up as a change inside this list.
    """

    tokens: list[int]
    logprobs: list[float]
    stop_reason: StopReason
    token_policy_versions: list[int] = field(default_factory=list)

    @property
    def policy_version(self) -> int:
        """The oldest policy version that produced any token of this sequence (-1 when empty)."""
        return min(self.token_policy_versions) if self.token_policy_versions else -1


@dataclass
class SampleResult:
    """The answer to one sample request: the prompt as consumed and `num_samples` sequences."""

    prompt_tokens: list[int]
    sequences: list[SampledSequence]


@dataclass(frozen=True)
class TokenEvent:
    """One token as it is sampled, for streaming: which sample of the request, the id, its logprob."""

    sample_index: int
    token: int
    logprob: float
    policy_version: int


@runtime_checkable
class TokenSampler(Protocol):
    """Samples continuations of token-id prompts and scores token sequences.

    Implementations are safe to call from many threads and many asyncio tasks at once; concurrent
    requests may be batched together.
    """

    @property
    def policy_version(self) -> int:
        """The version of the weights new requests are sampled with."""
        ...

    @property
    def max_context(self) -> int:
        """Most tokens (prompt + sampled) a sequence may have."""
        ...

    def sample(self, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int = 1) -> SampleResult:
        """Sample `num_samples` continuations of `prompt_tokens`, blocking until all are done."""
        ...

    async def sample_async(
        self, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int = 1
    ) -> SampleResult:
        """Async form of `sample`."""
        ...

    def compute_logprobs(self, token_ids: Sequence[int]) -> list[float | None]:
        """Raw logprob of each token given the ones before it; the first entry is None."""
        ...

    async def compute_logprobs_async(self, token_ids: Sequence[int]) -> list[float | None]:
        """Async form of `compute_logprobs`."""
        ...


@runtime_checkable
class StreamingTokenSampler(TokenSampler, Protocol):
    """A sampler that can hand out tokens while it samples them."""

    def sample_stream(
        self, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int = 1
    ) -> AsyncIterator[TokenEvent | SampleResult]:
        """Yield a TokenEvent per sampled token as it is made, then the full SampleResult last."""
        ...


@runtime_checkable
class AdapterSampler(Protocol):
    """A sampler that takes new weights as a peft adapter folder (remote servers, vLLM) instead of tensors.

    The trainer writes the adapter of policy version N to `adapter_path(N)` and calls
    `load_adapter(path, N)`; from then on new requests sample with it.
    """

    @property
    def policy_version(self) -> int:
        """The version of the weights new requests are sampled with."""
        ...

    def adapter_path(self, version: int) -> Any:
        """The folder the adapter of `version` should be written to (readable by whoever samples)."""
        ...

    def load_adapter(self, path: Any, version: int | None = None) -> int:
        """Sample new requests with the adapter in `path` as policy `version`; returns the version."""
        ...


async def stream_tokens(
    sampler: TokenSampler, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int = 1
) -> AsyncIterator[TokenEvent | SampleResult]:
    """Token events then the result: live from a streaming sampler, else replayed after sampling."""
    if isinstance(sampler, StreamingTokenSampler):
        async for item in sampler.sample_stream(prompt_tokens, params, num_samples):
            yield item
        return
    result = await sampler.sample_async(prompt_tokens, params, num_samples)
    for index, sequence in enumerate(result.sequences):
        for token, logprob, version in zip(
            sequence.tokens, sequence.logprobs, sequence.token_policy_versions, strict=True
        ):
            yield TokenEvent(index, token, logprob, version)
    yield result
