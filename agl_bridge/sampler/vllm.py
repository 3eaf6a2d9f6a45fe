"""`VLLMSampler`: an in-process vLLM engine as a `TokenSampler`, for one-process runs on a GPU box.

Install with `pip install 'agl-bridge[vllm]'` on a CUDA machine. vLLM is imported only when this
sampler is created; without vLLM or without a CUDA GPU the constructor raises `VLLMUnavailableError`
(an ImportError) saying what to install or to use `--sampler remote` instead.

The engine (`vllm.AsyncLLMEngine`) runs on a private event loop; prompts go in as
`TokensPrompt(prompt_token_ids=...)`, so vLLM never tokenizes, and each sequence comes back with its
token ids, the logprob of each sampled token (`logprobs=0`; raw logprobs, vLLM's default
`logprobs_mode`) and its finish reason. Weight syncs load the trainer's adapter as a `LoRARequest`
named `<model>-v<N>`; requests carry the active one, so every token reports the version that
produced it. Not run in this repository's CI (no GPU there): its tests are marked `gpu`.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agl_bridge.sampler._loop_thread import LoopThread
from agl_bridge.sampler.base import ContextLengthError, SampledSequence, SampleResult, SamplingParams, StopReason

INSTALL_HINT = "pip install 'agl-bridge[vllm]' on a machine with a CUDA GPU"


class VLLMUnavailableError(ImportError):
    """vLLM cannot run here (not installed, or no CUDA GPU); the message says what to do."""


def require_vllm() -> Any:
    """The `vllm` module, or VLLMUnavailableError naming what is missing."""
    try:
        import vllm
    except ImportError as error:
        raise VLLMUnavailableError(
            f"the vllm sampler needs vLLM, which is not installed ({error}): {INSTALL_HINT}; "
            "or run vLLM as a server and use --sampler remote --sampler-url URL"
        ) from None
    import torch

    if not torch.cuda.is_available():
        raise VLLMUnavailableError(
            "the vllm sampler needs a CUDA GPU and none is visible to torch: run on a GPU machine "
            f"({INSTALL_HINT}), or use --sampler hf (CPU) or --sampler remote with vLLM on another machine"
        )
    return vllm


class VLLMSampler:
    """A `TokenSampler` over an in-process vLLM engine (GPU only).

    model: a local path or hub id. max_batch_size: most samples one request may ask for (vLLM
    schedules batches itself). adapter_dir: where trainer adapters are written for `load_adapter`.
    engine_kwargs: passed to `vllm.AsyncEngineArgs` (e.g. gpu_memory_utilization, max_model_len).
    """

    def __init__(
        self,
        model: str,
        *,
        tokenizer: Any = None,
        max_batch_size: int = 64,
        max_lora_rank: int = 64,
        adapter_dir: str | os.PathLike[str] | None = None,
        seed: int | None = None,
        **engine_kwargs: Any,
    ) -> None:
        self._vllm = require_vllm()
        self.model = str(model)
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.adapter_dir = None if adapter_dir is None else Path(adapter_dir)
        self._loop = LoopThread("agl-vllm-engine")
        self._lock = threading.Lock()
        self._lora: Any = None  # the active vllm LoRARequest (None: base weights)
        self._version = 0
        self._lora_ids = itertools.count(1)
        args: dict[str, Any] = {
            "model": self.model,
            "enable_lora": True,
            "max_lora_rank": max_lora_rank,
            **engine_kwargs,
        }
        if seed is not None:
            args.setdefault("seed", seed)
        if "logprobs_mode" in getattr(self._vllm.AsyncEngineArgs, "__dataclass_fields__", {}):
            args.setdefault("logprobs_mode", "raw_logprobs")  # the model's own distribution, as the trainer scores
        self._engine = self._loop.run(self._start(args))
        self._max_context = int(self._loop.run(self._model_len()))
        self._vocab_size = len(tokenizer) if tokenizer is not None else None

    async def _start(self, args: dict[str, Any]) -> Any:
        return self._vllm.AsyncLLMEngine.from_engine_args(self._vllm.AsyncEngineArgs(**args))

    async def _model_len(self) -> int:
        config = await self._engine.get_model_config()
        return int(config.max_model_len)

    @property
    def policy_version(self) -> int:
        """The version of the adapter new requests use (0: the base weights)."""
        return self._version

    @property
    def max_context(self) -> int:
        """vLLM's max_model_len."""
        return self._max_context

    @property
    def vocab_size(self) -> int | None:
        """Vocabulary size prompts are checked against (None without a tokenizer)."""
        return self._vocab_size

    def sample(self, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int = 1) -> SampleResult:
        """Sample `num_samples` continuations of `prompt_tokens`, blocking until all are done."""
        return self._loop.run(self._sample(prompt_tokens, params, num_samples))

    async def sample_async(
        self, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int = 1
    ) -> SampleResult:
        """Async form of `sample` (runs on the engine's loop)."""
        return await asyncio.wrap_future(self._loop.submit(self._sample(prompt_tokens, params, num_samples)))

    def compute_logprobs(self, token_ids: Sequence[int]) -> list[float | None]:
        """Raw logprob of each token given the ones before it (vLLM prompt_logprobs); the first is None."""
        return self._loop.run(self._score(token_ids))

    async def compute_logprobs_async(self, token_ids: Sequence[int]) -> list[float | None]:
        """Async form of `compute_logprobs`."""
        return await asyncio.wrap_future(self._loop.submit(self._score(token_ids)))

    def adapter_path(self, version: int) -> Path:
        """Where the adapter of policy `version` is written: `adapter_dir/<model name>-v<version>`."""
        if self.adapter_dir is None:
            raise ValueError("syncing weights to the vllm sampler needs adapter_dir (config key adapter_dir)")
        return self.adapter_dir / f"{Path(self.model).name}-v{version}"

    def load_adapter(self, path: str | os.PathLike[str], version: int | None = None) -> int:
        """Use the peft adapter at `path` for new requests as policy `version` (default current + 1)."""
        return self._loop.run(self._load(str(path), version))

    def close(self) -> None:
        """Stop the engine's loop (vLLM frees the GPU when the process ends)."""
        engine, self._engine = self._engine, None
        shutdown = getattr(engine, "shutdown", None)
        if callable(shutdown):
            shutdown()
        self._loop.close()

    # ------------------------------------------------------------------ on the engine's loop

    async def _sample(self, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int) -> SampleResult:
        params.validate(self._vocab_size)
        prompt = [int(t) for t in prompt_tokens]
        if not prompt:
            raise ValueError("prompt_tokens must contain at least one token")
        if len(prompt) >= self._max_context:
            raise ContextLengthError(len(prompt), self._max_context)
        if not 1 <= num_samples <= self.max_batch_size:
            raise ValueError(f"num_samples must be in 1..{self.max_batch_size}, got {num_samples}")
        lora, version = self._lora, self._version
        sampling = self._vllm.SamplingParams(**self._sampling_kwargs(params, num_samples, len(prompt)))
        final = await self._generate(prompt, sampling, lora)
        sequences = []
        for output in sorted(final.outputs, key=lambda o: o.index):
            tokens = list(output.token_ids)
            logprobs = [float(step[token].logprob) for step, token in zip(output.logprobs or [], tokens, strict=True)]
            if len(logprobs) != len(tokens):
                raise RuntimeError(
                    f"vLLM returned {len(logprobs)} logprobs for {len(tokens)} tokens (logprobs=0 was asked)"
                )
            reason: StopReason = "length" if output.finish_reason == "length" else "stop"
            sequences.append(SampledSequence(tokens, logprobs, reason, [version] * len(tokens)))
        return SampleResult(list(final.prompt_token_ids or prompt), sequences)

    async def _score(self, token_ids: Sequence[int]) -> list[float | None]:
        ids = [int(t) for t in token_ids]
        if len(ids) <= 1:
            return [None] * len(ids)
        sampling = self._vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        final = await self._generate(ids, sampling, self._lora)
        entries = final.prompt_logprobs or []
        return [None, *(float(entries[i][ids[i]].logprob) for i in range(1, len(ids)))]

    async def _generate(self, prompt: list[int], sampling: Any, lora: Any) -> Any:
        from vllm.inputs import TokensPrompt

        final = None
        async for output in self._engine.generate(
            TokensPrompt(prompt_token_ids=prompt), sampling, request_id=uuid.uuid4().hex, lora_request=lora
        ):
            final = output
        if final is None:
            raise RuntimeError("vLLM finished the request without any output")
        return final

    async def _load(self, path: str, version: int | None) -> int:
        from vllm.lora.request import LoRARequest

        new_version = self._version + 1 if version is None else int(version)
        request = LoRARequest(
            f"{Path(self.model).name}-v{new_version}", next(self._lora_ids), str(Path(path).resolve())
        )
        await self._engine.add_lora(request)
        # Requests already running keep their adapter; vLLM's LoRA cache is LRU over max_loras and
        # evicts the old one once unused, so it is not removed here (removing it could cut them off).
        self._lora, self._version = request, new_version
        return new_version

    def _sampling_kwargs(self, params: SamplingParams, num_samples: int, prompt_length: int) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "n": num_samples,
            "max_tokens": params.max_tokens or (self._max_context - prompt_length),
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1,
            "seed": params.seed,
            "logprobs": 0,
        }
        if params.stop is not None:
            kwargs.update(ignore_eos=True, stop_token_ids=list(params.stop_token_ids), stop=list(params.stop_strings))
        return kwargs
