"""`TrainingClient`: Tinker's training primitives over a local torch + peft LoRA model.

``forward_backward`` accumulates gradients (call it several times to micro-batch), ``optim_step``
applies AdamW and zeroes them, ``save_weights_and_get_sampling_client`` merges the adapter into
the `HFSampler` (in this process, or in its child process: `HFProcessSampler`) between two decode
steps (no restart, no dropped requests).

Logprobs: input ids → logits → log_softmax in float32 → gather the targets; the sampler computes
the same raw quantity, so on the first on-policy step the importance ratio is 1 up to float noise.
The model stays in eval mode (LoRA dropout 0) so the trainer scores exactly the function the
sampler samples from. `full_weights=True` trains every weight instead of a LoRA; the sampler then
gets the whole weights, and the reference policy is a frozen copy of the base.

Threading: all model work runs on one worker thread, in call order; the sync methods wait for it,
the ``*_async`` ones return a `TrainFuture` at once (awaitable, or ``.result()``), so a loop can
queue ``forward_backward_async`` then ``optim_step_async`` and await both later.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import threading
import time
import warnings
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Self, TypeVar, cast

import torch
from peft import (
    LoraConfig,
    get_peft_model,
    get_peft_model_state_dict,
    set_peft_model_state_dict,
)
from peft.tuners.lora import LoraLayer

from agl_bridge.models.loading import load_causal_lm, load_tokenizer, resolve_model_path
from agl_bridge.primitives.batching import MicroBatch, micro_batches
from agl_bridge.primitives.checkpoint import (
    ModelIdentity,
    config_fingerprint,
    read_state_directory,
    restore_rng_state,
    save_adapter_directory,
    save_model_directory,
    save_state_directory,
    weights_hash,
)
from agl_bridge.primitives.datum import (
    LOGPROBS,
    TARGET_TOKENS,
    WEIGHTS,
    Datum,
    DatumTensors,
    to_tensors,
)
from agl_bridge.primitives.lora import check_mergeable, lora_targets, untie_output_embeddings
from agl_bridge.primitives.losses import LossSpec, compute_loss, get_loss, resolve_config
from agl_bridge.primitives.metrics import StepMetrics, token_entropy
from agl_bridge.primitives.sampling_client import SamplingClient
from agl_bridge.sampler.base import AdapterSampler, TokenSampler
from agl_bridge.sampler.hf import HFSampler
from agl_bridge.sampler.hf_process import HFProcessSampler
from agl_bridge.sampler.weights import PEFT_PREFIX, embeddings_tied

T = TypeVar("T")

CustomLossFn = Callable[[list[Datum], list[torch.Tensor]], tuple[torch.Tensor, dict[str, float]]]
"""fn(data, logprobs_list) -> (scalar loss, metrics); logprobs_list[i] is datum i's per-target logprobs (with grad)."""


DEFAULT_MAX_BATCH_TOKENS = 16384
"""Most padded tokens in one forward pass unless a client is told otherwise (what bounds activation memory)."""


@dataclass(frozen=True)
class AdamParams:
    """AdamW hyper-parameters for one `optim_step` (Tinker's names); set per call, so schedules work.

    grad_clip_norm: clip the global gradient norm to this; None or 0 disables clipping.
    """

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip_norm: float | None = 1.0

    def validate(self) -> None:
        """Raise ValueError naming the first out-of-range field."""
        checks = (
            ("learning_rate", self.learning_rate, lambda v: v >= 0, ">= 0"),
            ("beta1", self.beta1, lambda v: 0 <= v < 1, "in [0, 1)"),
            ("beta2", self.beta2, lambda v: 0 <= v < 1, "in [0, 1)"),
            ("eps", self.eps, lambda v: v > 0, "> 0"),
            ("weight_decay", self.weight_decay, lambda v: v >= 0, ">= 0"),
        )
        for name, value, ok, allowed in checks:
            if (
                not isinstance(value, (int, float))
                or isinstance(value, bool)
                or not math.isfinite(value)
                or not ok(value)
            ):
                raise ValueError(f"AdamParams.{name} must be a finite number {allowed}, got {value!r}")
        clip = self.grad_clip_norm
        if clip is not None and (not isinstance(clip, (int, float)) or not math.isfinite(clip) or clip < 0):
            raise ValueError(f"AdamParams.grad_clip_norm must be a finite number >= 0 or None, got {clip!r}")


@dataclass
class ForwardBackwardOutput:
    """Result of forward / forward_backward: per-datum outputs and batch metrics.

    loss_fn_outputs[i]["logprobs"]: datum i's per-target trainer logprobs (float32, CPU, no grad);
    metrics: see docs/primitives.md (loss, tokens, ratio_mean, logprob_diff_abs_mean/max,
    prob_pearson, clip fractions, kl_mean, entropy_mean, time_s).
    """

    loss_fn_outputs: list[dict[str, torch.Tensor]]
    metrics: dict[str, float]


@dataclass
class OptimStepOutput:
    """Result of optim_step: grad_norm (before clipping), lr, step (after the update)."""

    metrics: dict[str, float]


@dataclass(frozen=True)
class SamplerWeights:
    """A CPU copy of the trained weights in the layout the in-process sampler loads: a snapshot that can be
    loaded again after training has moved on (a Tinker sampling session pinned to its weights).

    lora_scaling: the LoRA's alpha / rank; None when `tensors` are whole weights (full-weight training).
    """

    tensors: dict[str, torch.Tensor]
    lora_scaling: float | None

    def load_into(self, sampler: HFSampler | HFProcessSampler, version: int | None = None) -> int:
        """Load these weights into `sampler` between two decode steps; returns its new policy version."""
        if self.lora_scaling is None:
            return sampler.load_weights(self.tensors, version=version)
        return sampler.load_lora(self.tensors, scaling=self.lora_scaling, version=version)


class TrainFuture(Generic[T]):
    """A queued training call: `await` it, or block with `result()`."""

    def __init__(self, future: concurrent.futures.Future[T]) -> None:
        self._future = future

    def result(self, timeout: float | None = None) -> T:
        """Block until the call finishes; return its result or raise its error."""
        return self._future.result(timeout)

    async def result_async(self) -> T:
        """Await the call's result."""
        return await asyncio.wrap_future(self._future)

    def done(self) -> bool:
        """Whether the call has finished."""
        return self._future.done()

    def __await__(self) -> Generator[Any, None, T]:
        return self.result_async().__await__()


class TrainingClient:
    """LoRA (or full-weight) training on a local model with Tinker's primitives (see the module docs).

    base_model: ``tiny``, a model directory, or a hub id (as `--model`). lora_rank / lora_alpha /
    target_modules: the peft LoRA; ``all-linear`` = every layer the sampler can merge a LoRA into
    (`nn.Linear`, GPT-2's `Conv1D`) but the output one — in a mixture-of-experts model that leaves
    out the stacked expert weights and the router, which peft's own ``all-linear`` adapts — or a
    list of module names (with the in-process sampler, each must be such a layer).
    train_unembedding: also train the output layer (lm_head) in full; with tied embeddings it gets
    its own copy. seed: LoRA initialisation (the global RNGs are left alone). device: default CUDA
    if available. dtype: default the checkpoint's. sampler: the in-process sampler to publish
    weights to (one over a fresh copy of the base model is created on first use if None).
    max_batch_tokens: most padded tokens per forward pass; larger batches are split into
    micro-batches whose gradients add up. full_weights: train every weight instead of a LoRA (the
    lora_* and target_modules arguments are unused; an AdapterSampler is refused).
    """

    def __init__(
        self,
        base_model: str = "tiny",
        *,
        lora_rank: int = 16,
        lora_alpha: float = 32,
        target_modules: str | Sequence[str] = "all-linear",
        train_unembedding: bool = False,
        seed: int = 0,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        sampler: HFSampler | HFProcessSampler | AdapterSampler | None = None,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        full_weights: bool = False,
    ) -> None:
        if full_weights and train_unembedding:
            raise ValueError("full_weights trains the output layer already; leave train_unembedding False")
        if full_weights and isinstance(sampler, AdapterSampler):
            raise ValueError(
                "full_weights publishes whole weights, which only the in-process samplers load (HFSampler, "
                "HFProcessSampler); remote and vLLM samplers load LoRA adapters — train a LoRA for them"
            )
        if not isinstance(lora_rank, int) or isinstance(lora_rank, bool) or lora_rank < 1:
            raise ValueError(f"lora_rank must be an integer >= 1, got {lora_rank!r}")
        if not isinstance(lora_alpha, (int, float)) or not math.isfinite(lora_alpha) or lora_alpha <= 0:
            raise ValueError(f"lora_alpha must be a finite number > 0, got {lora_alpha!r}")
        if not isinstance(max_batch_tokens, int) or max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be an integer >= 1, got {max_batch_tokens!r}")
        self._device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self._dtype = dtype
        self._seed = seed
        self._base_path = resolve_model_path(base_model)
        self._lora_rank = lora_rank
        self._lora_alpha = float(lora_alpha)
        self._train_unembedding = bool(train_unembedding)
        self._full_weights = bool(full_weights)
        self._max_batch_tokens = max_batch_tokens
        self._tokenizer: Any = None
        self._reference: torch.nn.Module | None = None

        base = load_causal_lm(self._base_path, device=str(self._device), dtype=dtype)
        fingerprint = config_fingerprint(base.config)
        base_hash = weights_hash(dict(base.named_parameters()))
        output_layer = base.get_output_embeddings()
        self._output_name = next(name for name, module in base.named_modules() if module is output_layer)
        self._vocab_size = int(output_layer.weight.shape[0])
        if sampler is not None:
            self._check_sampler(sampler, fingerprint)

        if full_weights:
            self._model = base.requires_grad_(True)
            lora_layers: dict[str, Any] = {}
        else:
            self._model = self._with_lora(base, lora_rank, lora_alpha, target_modules, train_unembedding, seed)
            lora_layers = {
                name.removeprefix(PEFT_PREFIX): module
                for name, module in self._model.named_modules()
                if isinstance(module, LoraLayer)
            }
            if not isinstance(sampler, AdapterSampler):  # the in-process sampler merges; remote servers load adapters
                check_mergeable(lora_layers)
        self._model.eval()
        self._params = [p for p in self._model.parameters() if p.requires_grad]
        adapted = sorted(lora_layers)
        self._identity = ModelIdentity(
            base_model=self._base_path,
            config_fingerprint=fingerprint,
            weights_hash=base_hash,
            lora_rank=0 if full_weights else lora_rank,  # 0: every weight trains
            lora_alpha=0.0 if full_weights else self._lora_alpha,
            target_modules=tuple(adapted),
            train_unembedding=self._train_unembedding,
        )
        self._optimizer = self._new_optimizer()
        self._step = 0
        self._sampler = sampler
        self._owns_sampler = False
        self._worker_ident: int | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="agl-train", initializer=self._remember_worker
        )
        self._closed = False
        self.last_sync_s: float | None = None
        """Seconds the latest weight sync to the sampler took."""

    def _with_lora(
        self,
        base: Any,
        lora_rank: int,
        lora_alpha: float,
        target_modules: str | Sequence[str],
        train_unembedding: bool,
        seed: int,
    ) -> Any:
        """`base` wrapped by peft with the LoRA to train (initialised from `seed`)."""
        config = LoraConfig(
            r=lora_rank,
            lora_alpha=lora_alpha,  # type: ignore[arg-type]  # peft annotates int; a float alpha works (alpha / r)
            target_modules=lora_targets(base, target_modules, self._output_name),
            lora_dropout=0.0,  # dropout would make trainer logprobs differ from the sampler's
            bias="none",
            modules_to_save=[self._output_name.rsplit(".", 1)[-1]] if train_unembedding else None,
        )
        devices = [self._device.index or 0] if self._device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), warnings.catch_warnings():
            # Untying a trained lm_head from the input embeddings is intended here (the sampler's
            # copy is untied to match), so peft's tied-weights warning is noise.
            warnings.filterwarnings("ignore", message=".*ensure_weight_tying.*")
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
            torch.manual_seed(seed)
            return get_peft_model(base, config)

    # ------------------------------------------------------------------ properties

    @property
    def step(self) -> int:
        """Number of optim_steps taken (restored by load_state)."""
        return self._step

    @property
    def model(self) -> torch.nn.Module:
        """The peft model; use it only between calls (the worker thread owns it during one)."""
        return self._model

    @property
    def device(self) -> torch.device:
        """Where the model lives."""
        return self._device

    @property
    def base_model(self) -> str:
        """The resolved base model path or hub id."""
        return self._base_path

    @property
    def identity(self) -> ModelIdentity:
        """What a saved state of this client is valid for."""
        return self._identity

    @property
    def lora_scaling(self) -> float:
        """lora_alpha / lora_rank: the factor on B·A."""
        return self._lora_alpha / self._lora_rank

    @property
    def vocab_size(self) -> int:
        """Size of the output vocabulary (valid target ids are 0..vocab_size-1)."""
        return self._vocab_size

    @property
    def sampler(self) -> HFSampler | HFProcessSampler | AdapterSampler | None:
        """The sampler weights are published to (None until the first sync when none was given)."""
        return self._sampler

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The LoRA (and unembedding) parameters the optimizer updates, in a fixed order."""
        return list(self._params)

    def get_tokenizer(self) -> Any:
        """The base model's tokenizer (loaded on first use)."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self._base_path)
        return self._tokenizer

    # ------------------------------------------------------------------ sync API

    def forward(
        self, data: Sequence[Datum], loss_fn: str | None = None, loss_fn_config: dict[str, Any] | None = None
    ) -> ForwardBackwardOutput:
        """Per-datum logprobs and loss metrics without gradients (loss_fn None: logprobs only)."""
        return self._run(self._forward_impl, data, loss_fn, loss_fn_config, False)

    def reference_logprobs(self, data: Sequence[Datum]) -> list[torch.Tensor]:
        """Each datum's per-target logprobs under the base model (the adapter disabled; float32, CPU).

        The reference of the KL term and of DPO: the policy before any training, without a second
        model in memory — except when training full weights, where a frozen copy of the base is
        loaded on first use.
        """
        return self._run(self._reference_impl, data)

    def forward_backward(
        self, data: Sequence[Datum], loss_fn: str, loss_fn_config: dict[str, Any] | None = None
    ) -> ForwardBackwardOutput:
        """Compute the summed loss over `data` and add its gradients to the accumulated ones."""
        return self._run(self._forward_impl, data, loss_fn, loss_fn_config, True)

    def forward_backward_custom(self, data: Sequence[Datum], fn: CustomLossFn) -> ForwardBackwardOutput:
        """Backpropagate `fn(data, logprobs_list) -> (loss, metrics)`; extra loss_fn_inputs keys are allowed."""
        return self._run(self._custom_impl, data, fn)

    def optim_step(self, params: AdamParams | None = None) -> OptimStepOutput:
        """Clip, apply one AdamW update with `params`, zero the gradients and count the step."""
        return self._run(self._optim_impl, params or AdamParams())

    def zero_grad(self) -> None:
        """Discard the accumulated gradients (e.g. to drop a bad micro-batch)."""
        self._run(self._optimizer.zero_grad, True)

    def save_state(self, path: str | Path) -> str:
        """Write adapter, optimizer, step, RNG states and model identity to directory `path` atomically."""
        return self._run(self._save_state_impl, Path(path))

    def load_state(self, path: str | Path, *, optimizer: bool = True) -> int:
        """Restore a save_state directory (CheckpointMismatchError if it is for another model/LoRA); returns the step.

        optimizer=False loads the adapter weights only (optimizer moments, step and RNGs are left
        as they are). Otherwise the step and the global python/numpy/torch RNGs are restored too.
        """
        return self._run(self._load_state_impl, Path(path), optimizer)

    def save_weights_for_sampler(self, path: str | Path) -> str:
        """Write the adapter as a peft adapter directory (loads with PeftModel.from_pretrained or vLLM);
        full weights: a model directory (loads with from_pretrained)."""
        return self._run(self._save_weights_impl, Path(path))

    def save_weights_and_get_sampling_client(
        self, name: str | None = None, *, version: int | None = None
    ) -> SamplingClient:
        """Publish the current adapter to the sampler (no restart) and return a client for it.

        An `HFSampler` (or `HFProcessSampler`, copied to its process) merges it between decode steps.
        An `AdapterSampler` (remote vLLM or agl-bridge servers, in-process vLLM) gets it as a peft folder written to
        `sampler.adapter_path(version)` and loaded as `<model>-v<version>`; older ones are unloaded.
        version: the policy version to give the new weights (default: the sampler's + 1). The
        sampler is created over a fresh copy of the base model on first use if none was given.
        """
        return self._run(self._sync_impl, name, version)

    # ------------------------------------------------------------------ async API

    def forward_async(
        self, data: Sequence[Datum], loss_fn: str | None = None, loss_fn_config: dict[str, Any] | None = None
    ) -> TrainFuture[ForwardBackwardOutput]:
        """Queue `forward`."""
        return self._submit(self._forward_impl, data, loss_fn, loss_fn_config, False)

    def reference_logprobs_async(self, data: Sequence[Datum]) -> TrainFuture[list[torch.Tensor]]:
        """Queue `reference_logprobs`."""
        return self._submit(self._reference_impl, data)

    def forward_backward_async(
        self, data: Sequence[Datum], loss_fn: str, loss_fn_config: dict[str, Any] | None = None
    ) -> TrainFuture[ForwardBackwardOutput]:
        """Queue `forward_backward`."""
        return self._submit(self._forward_impl, data, loss_fn, loss_fn_config, True)

    def forward_backward_custom_async(
        self, data: Sequence[Datum], fn: CustomLossFn
    ) -> TrainFuture[ForwardBackwardOutput]:
        """Queue `forward_backward_custom`."""
        return self._submit(self._custom_impl, data, fn)

    def optim_step_async(self, params: AdamParams | None = None) -> TrainFuture[OptimStepOutput]:
        """Queue `optim_step`."""
        return self._submit(self._optim_impl, params or AdamParams())

    def save_state_async(self, path: str | Path) -> TrainFuture[str]:
        """Queue `save_state`."""
        return self._submit(self._save_state_impl, Path(path))

    def load_state_async(self, path: str | Path, *, optimizer: bool = True) -> TrainFuture[int]:
        """Queue `load_state`."""
        return self._submit(self._load_state_impl, Path(path), optimizer)

    def save_weights_and_get_sampling_client_async(
        self, name: str | None = None, *, version: int | None = None
    ) -> TrainFuture[SamplingClient]:
        """Queue `save_weights_and_get_sampling_client`."""
        return self._submit(self._sync_impl, name, version)

    def save_weights_for_sampler_async(self, path: str | Path) -> TrainFuture[str]:
        """Queue `save_weights_for_sampler`."""
        return self._submit(self._save_weights_impl, Path(path))

    def sampler_weights_async(self) -> TrainFuture[SamplerWeights]:
        """Queue a copy of the current weights as the in-process sampler loads them (see `SamplerWeights`)."""
        return self._submit(self._sampler_weights_impl)

    def close(self) -> None:
        """Finish queued calls, stop the worker, and close the sampler if this client created it."""
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown(wait=True)
        if self._owns_sampler and self._sampler is not None:
            cast(HFSampler, self._sampler).close()  # an owned sampler is the HFSampler _ensure_sampler made

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ worker plumbing

    def _remember_worker(self) -> None:
        self._worker_ident = threading.get_ident()

    def _submit(self, fn: Callable[..., T], *args: Any) -> TrainFuture[T]:
        if self._closed:
            raise RuntimeError("the TrainingClient is closed; create a new one")
        return TrainFuture(self._executor.submit(fn, *args))

    def _run(self, fn: Callable[..., T], *args: Any) -> T:
        # A custom loss calling back into the client runs inline instead of deadlocking on itself.
        if threading.get_ident() == self._worker_ident:
            return fn(*args)
        return self._submit(fn, *args).result()

    # ------------------------------------------------------------------ forward / backward

    def _forward_impl(
        self, data: Sequence[Datum], loss_fn: str | None, loss_fn_config: dict[str, Any] | None, backward: bool
    ) -> ForwardBackwardOutput:
        start = time.perf_counter()
        spec, config, tensors = self._prepare(data, loss_fn, loss_fn_config)
        metrics, outputs = self._accumulate(tensors, spec, config, backward)
        return ForwardBackwardOutput(outputs, metrics.result({"time_s": time.perf_counter() - start}))

    def _prepare(
        self, data: Sequence[Datum], loss_fn: str | None, loss_fn_config: dict[str, Any] | None
    ) -> tuple[LossSpec | None, dict[str, Any], list[DatumTensors]]:
        """The loss, its resolved config and the checked datums of a forward call (ValueError/DatumError
        naming what is wrong)."""
        spec: LossSpec | None = get_loss(loss_fn) if loss_fn is not None else None
        if spec is None and loss_fn_config:
            raise ValueError("loss_fn_config was given without a loss_fn; name the loss it configures")
        config = resolve_config(spec, loss_fn_config) if spec is not None else {}
        required = spec.required if spec is not None else (TARGET_TOKENS,)
        return spec, config, self._validate(data, required=required, allow_unknown=False)

    def _accumulate(
        self, tensors: list[DatumTensors], spec: LossSpec | None, config: dict[str, Any], backward: bool
    ) -> tuple[StepMetrics, list[dict[str, torch.Tensor]]]:
        """Score checked datums (adding their loss's gradients when `backward`): the call's metrics and
        each datum's outputs."""
        want_kl = bool(config.get("kl_coef"))
        metrics = StepMetrics()
        metrics.num_datums = len(tensors)
        outputs: list[dict[str, torch.Tensor]] = [{} for _ in tensors]
        for batch in micro_batches(tensors, self._max_batch_tokens, self._device):
            with torch.set_grad_enabled(backward):
                lp, entropy = self._token_logprobs(batch)
                ref = None
                if want_kl:
                    with torch.no_grad(), self._reference_policy() as reference:
                        ref, _ = self._token_logprobs(batch, entropy=False, model=reference)
                if spec is not None:
                    inputs = {WEIGHTS: batch.weights, **batch.fields}
                    result = compute_loss(spec, lp, inputs, config, ref)
                    if backward:
                        result.loss.backward()
                    metrics.loss += float(result.loss.detach())
                    metrics.add_token_metrics(batch.weights > 0, result.token_metrics)
            self._record(batch, lp, entropy, metrics, outputs, ref)
        return metrics, outputs

    def _reference_impl(self, data: Sequence[Datum]) -> list[torch.Tensor]:
        tensors = self._validate(data, required=(TARGET_TOKENS,), allow_unknown=True)
        logprobs: list[torch.Tensor] = [torch.empty(0)] * len(tensors)
        with torch.no_grad(), self._reference_policy() as reference:
            for batch in micro_batches(tensors, self._max_batch_tokens, self._device):
                lp, _ = self._token_logprobs(batch, entropy=False, model=reference)
                for row, (index, length) in enumerate(zip(batch.indices, batch.lengths, strict=True)):
                    logprobs[index] = lp[row, :length].float().cpu()
        return logprobs

    def _custom_impl(self, data: Sequence[Datum], fn: CustomLossFn) -> ForwardBackwardOutput:
        start = time.perf_counter()
        tensors = self._validate(data, required=(TARGET_TOKENS,), allow_unknown=True)
        metrics = StepMetrics()
        metrics.num_datums = len(tensors)
        outputs: list[dict[str, torch.Tensor]] = [{} for _ in tensors]
        logprobs: list[torch.Tensor] = [torch.empty(0)] * len(tensors)
        with torch.enable_grad():
            for batch in micro_batches(tensors, self._max_batch_tokens, self._device):
                lp, entropy = self._token_logprobs(batch)
                for row, (index, length) in enumerate(zip(batch.indices, batch.lengths, strict=True)):
                    logprobs[index] = lp[row, :length]
                self._record(batch, lp, entropy, metrics, outputs, None)
            returned = fn(list(data), logprobs)
            if not (isinstance(returned, tuple) and len(returned) == 2):
                raise TypeError(f"a custom loss must return (loss, metrics), got {type(returned).__name__}")
            loss, user_metrics = returned
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
                raise TypeError(
                    "a custom loss must return a scalar tensor computed from the logprobs it was given "
                    f"(with grad); got {type(loss).__name__}"
                    + (
                        f" of shape {tuple(loss.shape)}, requires_grad={loss.requires_grad}"
                        if isinstance(loss, torch.Tensor)
                        else ""
                    )
                )
            loss.reshape(()).backward()
        metrics.loss = float(loss.detach())
        extra = {str(k): float(v) for k, v in dict(user_metrics or {}).items()}
        return ForwardBackwardOutput(outputs, metrics.result({**extra, "time_s": time.perf_counter() - start}))

    def _validate(self, data: Sequence[Datum], *, required: Sequence[str], allow_unknown: bool) -> list[DatumTensors]:
        if isinstance(data, Datum) or not isinstance(data, Sequence):
            raise TypeError(f"data must be a list of Datum, got {type(data).__name__}")
        if not data:
            raise ValueError("data is empty; pass at least one Datum")
        return [
            to_tensors(
                d, i, required=required, allow_unknown=allow_unknown, vocab_size=self._vocab_size, device=self._device
            )
            for i, d in enumerate(data)
        ]

    @contextlib.contextmanager
    def _reference_policy(self) -> Iterator[torch.nn.Module]:
        """The policy before any training: the model with its adapter off, or, training full
        weights, a frozen copy of the base model (loaded on first use)."""
        if not self._full_weights:
            with self._model.disable_adapter():
                yield self._model
            return
        if self._reference is None:
            reference = load_causal_lm(self._base_path, device=str(self._device), dtype=self._dtype)
            self._reference = reference.requires_grad_(False)
        yield self._reference

    def _token_logprobs(
        self, batch: MicroBatch, *, entropy: bool = True, model: torch.nn.Module | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-target logprobs [b, L] (float32) under `model` (default: the trained one) and, if asked,
        per-position entropy (no grad)."""
        # No attention mask: rows are right-padded and attention is causal, so a real token never
        # sees padding (padded positions are scored but weigh 0). This is also exactly the call the
        # sampler's scoring makes, which keeps the two numerically aligned.
        logits = (model or self._model)(input_ids=batch.input_ids, use_cache=False).logits
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        lp = logprobs.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)
        ent = None
        if entropy:
            with torch.no_grad():
                ent = torch.stack([token_entropy(row) for row in logprobs.detach()])  # row by row bounds memory
        return lp, ent

    def _record(
        self,
        batch: MicroBatch,
        lp: torch.Tensor,
        entropy: torch.Tensor | None,
        metrics: StepMetrics,
        outputs: list[dict[str, torch.Tensor]],
        ref: torch.Tensor | None,
    ) -> None:
        active = batch.weights > 0
        metrics.add_tokens(active, entropy)
        if LOGPROBS in batch.fields and bool(batch.has_logprobs.any()):
            metrics.add_gap(active & batch.has_logprobs.unsqueeze(1), lp, batch.fields[LOGPROBS])
        for row, (index, length) in enumerate(zip(batch.indices, batch.lengths, strict=True)):
            outputs[index]["logprobs"] = lp[row, :length].detach().float().cpu()
            if ref is not None:
                outputs[index]["ref_logprobs"] = ref[row, :length].detach().float().cpu()

    # ------------------------------------------------------------------ optimizer

    def _new_optimizer(self) -> torch.optim.AdamW:
        """AdamW over the trained parameters, at AdamParams' defaults (each step sets its own)."""
        defaults = AdamParams()
        return torch.optim.AdamW(
            self._params,
            lr=defaults.learning_rate,
            betas=(defaults.beta1, defaults.beta2),
            eps=defaults.eps,
            weight_decay=defaults.weight_decay,
        )

    def _optim_impl(self, params: AdamParams) -> OptimStepOutput:
        if not isinstance(params, AdamParams):
            raise TypeError(f"optim_step takes AdamParams, got {type(params).__name__}")
        params.validate()
        for group in self._optimizer.param_groups:
            group["lr"] = params.learning_rate
            group["betas"] = (params.beta1, params.beta2)
            group["eps"] = params.eps
            group["weight_decay"] = params.weight_decay
        with_grad = [p for p in self._params if p.grad is not None]
        grad_norm = 0.0
        if with_grad:
            clip = params.grad_clip_norm if params.grad_clip_norm else math.inf
            grad_norm = float(torch.nn.utils.clip_grad_norm_(with_grad, clip))
            if not math.isfinite(grad_norm):
                self._optimizer.zero_grad(set_to_none=True)
                raise FloatingPointError(
                    f"gradient norm is {grad_norm} at step {self._step}; the update was skipped and the "
                    "gradients discarded. Check the batch's advantages/logprobs (ratio overflow?) or lower "
                    "the learning rate"
                )
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)
        self._step += 1
        return OptimStepOutput({"grad_norm": grad_norm, "lr": params.learning_rate, "step": float(self._step)})

    # ------------------------------------------------------------------ checkpoints

    def _trained_state(self) -> dict[str, torch.Tensor]:
        """The trained tensors, whole (a sharded client gathers them here): the adapter keyed as peft
        saves it, or every weight by name (tied ones once), in the order of `trainable_parameters`."""
        if self._full_weights:
            return dict(self._model.named_parameters())
        return get_peft_model_state_dict(self._model)

    def _optimizer_state(self) -> dict[str, Any]:
        """The optimizer's state dict, whole (a sharded client gathers it here)."""
        return self._optimizer.state_dict()

    def _adapter_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu").contiguous().clone() for k, v in self._trained_state().items()}

    def _save_state_impl(self, path: Path) -> str:
        return save_state_directory(
            path,
            adapter=self._adapter_state(),
            peft_config=None if self._full_weights else self._model.peft_config["default"],
            optimizer_state=self._optimizer_state(),
            step=self._step,
            identity=self._identity,
        )

    def _load_state_impl(self, path: Path, optimizer: bool) -> int:
        expected = set(TrainingClient._trained_state(self))
        state = read_state_directory(path, self._identity, expected, self._device, optimizer=optimizer)
        # Everything is read and checked; only now touch the live state.
        self._optimizer.zero_grad(set_to_none=True)
        if state.optimizer_state is not None and state.rng_state is not None:
            self._apply_state(state.adapter, state.optimizer_state, state.step)
            restore_rng_state(state.rng_state)
        else:
            self._apply_state(state.adapter, None, self._step)
        return self._step

    def _apply_state(self, adapter: dict[str, torch.Tensor], optimizer_state: dict[str, Any] | None, step: int) -> None:
        """Load checked checkpoint tensors: the adapter (or weights), the optimizer's state if given, the step."""
        if self._full_weights:
            with torch.no_grad():
                for name, param in self._model.named_parameters():
                    param.copy_(adapter[name])
        else:
            set_peft_model_state_dict(self._model, adapter)
        if optimizer_state is not None:
            self._optimizer.load_state_dict(optimizer_state)
        self._step = step

    def _save_weights_impl(self, path: Path) -> str:
        if self._full_weights:
            return save_model_directory(path, self._model, self._adapter_state())
        return save_adapter_directory(path, self._adapter_state(), self._model.peft_config["default"])

    # ------------------------------------------------------------------ weight sync

    def _sync_impl(self, name: str | None, version: int | None) -> SamplingClient:
        start = time.perf_counter()
        sampler = self._ensure_sampler()
        if isinstance(sampler, AdapterSampler):
            # Remote servers and vLLM load adapters from files: write the peft folder where they read it.
            target = sampler.policy_version + 1 if version is None else version
            path = sampler.adapter_path(target)
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._save_weights_impl(Path(path))
            new_version = sampler.load_adapter(path, target)
        elif self._full_weights:
            new_version = sampler.load_weights(self._sync_state_dict(), version=version)
        else:
            new_version = sampler.load_lora(self._sync_state_dict(), scaling=self.lora_scaling, version=version)
        self.last_sync_s = time.perf_counter() - start
        # Adapter samplers (remote, vLLM) are token samplers too.
        return SamplingClient(cast(TokenSampler, sampler), weights_version=new_version, name=name)

    def _sampler_weights_impl(self) -> SamplerWeights:
        tensors = {key: value.to("cpu", copy=True) for key, value in self._sync_state_dict().items()}
        return SamplerWeights(tensors, None if self._full_weights else self.lora_scaling)

    def _sync_state_dict(self) -> dict[str, torch.Tensor]:
        """The adapter in the layout `HFSampler.load_lora` takes, or the weights `load_weights` takes
        (live views: the call blocks until merged)."""
        if self._full_weights:
            return {key: value.detach() for key, value in self._trained_state().items()}
        output_key = f"{PEFT_PREFIX}{self._output_name}.weight"
        state: dict[str, torch.Tensor] = {}
        for key, value in self._trained_state().items():
            if ".lora_A." in key or ".lora_B." in key:
                state[key] = value.detach()
            elif self._train_unembedding and key == output_key:
                state[f"{PEFT_PREFIX}{self._output_name}.modules_to_save.default.weight"] = value.detach()
            else:
                raise RuntimeError(f"unexpected adapter tensor {key!r}; the sampler cannot merge it")
        return state

    def _ensure_sampler(self) -> HFSampler | HFProcessSampler | AdapterSampler:
        if self._sampler is None:
            model = load_causal_lm(self._base_path, device=str(self._device), dtype=self._dtype)
            if self._train_unembedding:
                untie_output_embeddings(model)
            try:
                tokenizer = self.get_tokenizer()
            except (OSError, ValueError):
                tokenizer = None  # token-id sampling works without one; only stop strings need it
            self._sampler = HFSampler(model, tokenizer, seed=self._seed)
            self._owns_sampler = True
        return self._sampler

    def _check_sampler(self, sampler: HFSampler | HFProcessSampler | AdapterSampler, fingerprint: str) -> None:
        if isinstance(sampler, HFProcessSampler):  # its model lives in its child process, which reports on it
            config, tied = sampler.model_config, sampler.embeddings_tied
        else:
            model = getattr(sampler, "model", None)
            if model is None or isinstance(sampler, AdapterSampler):  # a remote / vLLM model is not ours to inspect
                return
            config, tied = model.config, embeddings_tied(model)
        if config_fingerprint(config) != fingerprint:
            raise ValueError(
                "the sampler's model has a different config from the base model "
                f"{self._base_path}; give a sampler over the same base model, or none to have one created"
            )
        if self._train_unembedding and tied:
            raise ValueError(
                "train_unembedding=True needs the sampler's output layer untied from its input embeddings "
                "(the trained lm_head gets its own copy); pass sampler=None to have a matching sampler "
                "created, or untie the sampler model's lm_head before creating the HFSampler"
            )
