"""`SamplingClient`: Tinker's handle for sampling from the weights a training client just published.

It is a thin wrapper over a `TokenSampler`. Unlike Tinker's, it is not pinned to one set of weights:
the in-process sampler holds one policy at a time, so after a later sync this client samples the
newer weights. `weights_version` says which version it was created for, `is_current` whether that
is still what new requests get, and every sampled token records the version that produced it.
"""

from __future__ import annotations

from collections.abc import Sequence

from agl_bridge.sampler.base import SampleResult, SamplingParams, TokenSampler


class SamplingClient:
    """Samples and scores with a sampler; created by `TrainingClient.save_weights_and_get_sampling_client`."""

    def __init__(self, sampler: TokenSampler, *, weights_version: int, name: str | None = None) -> None:
        self._sampler = sampler
        self.weights_version = weights_version
        self.name = name

    @property
    def sampler(self) -> TokenSampler:
        """The underlying token sampler."""
        return self._sampler

    @property
    def policy_version(self) -> int:
        """The version of the weights new requests are sampled with right now."""
        return self._sampler.policy_version

    @property
    def is_current(self) -> bool:
        """Whether the sampler still serves the weights this client was created for."""
        return self._sampler.policy_version == self.weights_version

    def sample(self, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int = 1) -> SampleResult:
        """Sample `num_samples` continuations of `prompt_tokens` (tokens, raw logprobs, per-token versions)."""
        return self._sampler.sample(prompt_tokens, params, num_samples)

    async def sample_async(
        self, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int = 1
    ) -> SampleResult:
        """Async form of `sample`; concurrent calls are batched by the sampler."""
        return await self._sampler.sample_async(prompt_tokens, params, num_samples)

    def compute_logprobs(self, token_ids: Sequence[int]) -> list[float | None]:
        """Raw logprob of each token given the ones before it (the first entry is None)."""
        return self._sampler.compute_logprobs(token_ids)

    async def compute_logprobs_async(self, token_ids: Sequence[int]) -> list[float | None]:
        """Async form of `compute_logprobs`."""
        return await self._sampler.compute_logprobs_async(token_ids)

    def __repr__(self) -> str:
        return (
            f"SamplingClient(name={self.name!r}, weights_version={self.weights_version}, "
            f"policy_version={self.policy_version})"
        )
