"""A sampler with no model that answers at once: for measuring the overhead of everything else.

It returns a fixed response (by default the ids of "I'm here." in the given tokenizer, or a fixed id
list) with logprob -0.5 per token. The proxy benchmark and the load tests use it to time the proxy,
tracing and store without model compute.
"""

from __future__ import annotations

from collections.abc import Sequence

from agl_bridge.sampler.base import ContextLengthError, SampledSequence, SampleResult, SamplingParams, StopReason


class InstantSampler:
    """A `TokenSampler` that returns `response_tokens` (cut to max_tokens) immediately."""

    def __init__(self, response_tokens: Sequence[int], *, vocab_size: int, max_context: int = 4096) -> None:
        if not response_tokens:
            raise ValueError("response_tokens must not be empty")
        self._response = [int(t) for t in response_tokens]
        self._vocab_size = vocab_size
        self._max_context = max_context
        self.policy_version = 0

    @property
    def max_context(self) -> int:
        """Most tokens one sequence may have."""
        return self._max_context

    @property
    def vocab_size(self) -> int:
        """Size of the vocabulary prompts are checked against."""
        return self._vocab_size

    def sample(self, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int = 1) -> SampleResult:
        """The fixed response, `num_samples` times."""
        params.validate(self._vocab_size)
        if len(prompt_tokens) >= self._max_context:
            raise ContextLengthError(len(prompt_tokens), self._max_context)
        tokens = self._response[: params.max_tokens or len(self._response)]
        reason: StopReason = "length" if len(tokens) < len(self._response) else "stop"
        sequence = [
            SampledSequence(list(tokens), [-0.5] * len(tokens), reason, [self.policy_version] * len(tokens))
            for _ in range(num_samples)
        ]
        return SampleResult(list(prompt_tokens), sequence)

    async def sample_async(
        self, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int = 1
    ) -> SampleResult:
        """Async form of `sample` (returns at once)."""
        return self.sample(prompt_tokens, params, num_samples)

    def compute_logprobs(self, token_ids: Sequence[int]) -> list[float | None]:
        """-0.5 for every token after the first."""
        return [None, *([-0.5] * (len(token_ids) - 1))] if token_ids else []

    async def compute_logprobs_async(self, token_ids: Sequence[int]) -> list[float | None]:
        """Async form of `compute_logprobs`."""
        return self.compute_logprobs(token_ids)
