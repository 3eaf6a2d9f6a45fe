"""The in-process vLLM sampler. Without vLLM it refuses with what to install; the GPU test needs vLLM's
CUDA build and a GPU and is skipped elsewhere, saying which one was missing. (vLLM's CPU build is
tested in test_vllm_inprocess.py, in the venv scripts/vllm_env.sh builds.)"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from agl_bridge.sampler.base import SamplingParams

HAS_VLLM = importlib.util.find_spec("vllm") is not None
HAS_CUDA = torch.cuda.is_available()
SKIP_REASON = (
    "needs vLLM and a CUDA GPU: "
    + ("vLLM is not installed (pip install 'agl-bridge[vllm]')" if not HAS_VLLM else "vLLM is installed")
    + ", "
    + ("no CUDA GPU is visible" if not HAS_CUDA else "a CUDA GPU is visible")
)


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed: the refusal cannot happen here")
def test_without_vllm_the_error_says_what_to_install() -> None:
    from agl_bridge.sampler.vllm import VLLMSampler, VLLMUnavailableError

    with pytest.raises(VLLMUnavailableError, match=r"pip install 'agl-bridge\[vllm\]'"):
        VLLMSampler("tiny")


def test_importing_the_package_does_not_import_vllm() -> None:
    import sys

    import agl_bridge.sampler.factory
    import agl_bridge.sampler.vllm  # noqa: F401

    assert "vllm" not in sys.modules or HAS_VLLM


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_VLLM and HAS_CUDA), reason=SKIP_REASON)
def test_vllm_samples_exact_ids_with_raw_logprobs(tiny_model_dir, tiny_tokenizer) -> None:
    from agl_bridge.sampler.vllm import VLLMSampler

    sampler = VLLMSampler(str(tiny_model_dir), tokenizer=tiny_tokenizer, gpu_memory_utilization=0.2, enforce_eager=True)
    try:
        prompt = [5, 17, 300, 42]
        result = sampler.sample(prompt, SamplingParams(max_tokens=8, temperature=1.0, seed=3, stop=[]), num_samples=2)
        assert result.prompt_tokens == prompt and len(result.sequences) == 2
        for sequence in result.sequences:
            assert len(sequence.tokens) == 8 and sequence.stop_reason == "length"
            scores = sampler.compute_logprobs(prompt + sequence.tokens)[len(prompt) :]
            assert sequence.logprobs == pytest.approx(scores, abs=1e-2)
        again = sampler.sample(prompt, SamplingParams(max_tokens=8, temperature=1.0, seed=3, stop=[]), num_samples=2)
        assert [s.tokens for s in again.sequences] == [s.tokens for s in result.sequences]
    finally:
        sampler.close()
