"""The Hugging Face transformers sampler: continuous batching over a KV cache, live weight swaps.

One worker thread owns the model. Requests from any thread or event loop go into its inbox; each
loop iteration it (1) applies pending weight updates and scoring requests, (2) prefills newly
arrived prompts together and merges them into the running batch, and (3) runs one decode step for
every running sequence. Sequences join and leave the batch between steps, so sixteen concurrent
agents share every forward pass instead of queueing.

Reproducibility: a request with a `seed` draws its random numbers from its own generator (sample i
of n uses seed + i), so run alone it repeats exactly. Batched with other requests it draws the same
random numbers, but the logits it sees can differ in the last bits (padding and batch shape change
the floating-point reduction order), so a draw that falls right at a probability boundary may
flip. Greedy decoding (temperature 0) is unaffected in practice.

Weight swaps happen between decode steps: requests in flight continue with the new weights (their
KV cache from the old weights is kept), and each token records the policy version that produced it.

Architectures: the KV cache is built from the model's own config (sliding-window layers keep only
their window; `kv_batch.py`). A model whose layers keep other state (linear attention, recurrent or
convolution state, chunked attention) is refused when the sampler is created, with a one-line
`UnsupportedArchitectureError` naming its type and the alternative (vLLM, `--sampler remote`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import queue
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from agl_bridge.sampler.base import (
    ContextLengthError,
    SampledSequence,
    SampleResult,
    SamplingParams,
    StopReason,
    TokenEvent,
)
from agl_bridge.sampler.kv_batch import CacheLayout, KVBatch
from agl_bridge.sampler.sampling import RowSampling, choose_tokens
from agl_bridge.sampler.stopping import StopChecker
from agl_bridge.sampler.weights import WeightLoader

logger = logging.getLogger(__name__)


def serving_torch_threads() -> int:
    """Torch intra-op threads for a server sampling in-process: one per usable core but one (at least 1).

    The spare core runs the HTTP event loop (the proxy's per-request work). Measured on 2 cores with
    the tiny model: 16 concurrent clients get 4.7x one client's tokens/s with 1 thread and 3.9x with
    2, while one client alone is as fast either way.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores - 1)


class SamplerClosedError(RuntimeError):
    """The sampler was closed before the request finished."""


def checked_prompt(
    prompt_tokens: Sequence[int],
    params: SamplingParams,
    num_samples: int,
    *,
    vocab_size: int,
    max_context: int,
    max_batch_size: int,
) -> list[int]:
    """The prompt's ids once a sample request passed the checks made before it is queued.

    Raises ValueError naming what is wrong: a sampling parameter (`SamplingParamError`), the number of
    samples, an empty prompt or an id outside the vocabulary, or a prompt that fills the context
    window (`ContextLengthError`). `HFSampler` and `HFProcessSampler` both check here, so a bad request
    is refused the same way, before anything is sampled.
    """
    params.validate(vocab_size)
    if not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be an integer >= 1, got {num_samples!r}")
    if num_samples > max_batch_size:
        raise ValueError(
            f"num_samples={num_samples} exceeds the sampler's max_batch_size={max_batch_size}; "
            "ask for fewer samples per request or start the sampler with a larger max_batch_size"
        )
    prompt = [int(t) for t in prompt_tokens]
    if not prompt:
        raise ValueError("prompt_tokens must contain at least one token")
    if any(t < 0 or t >= vocab_size for t in prompt):
        bad = next(t for t in prompt if t < 0 or t >= vocab_size)
        raise ValueError(f"prompt token id {bad} is outside the vocabulary 0..{vocab_size - 1}")
    if len(prompt) >= max_context:
        raise ContextLengthError(len(prompt), max_context)
    return prompt


@dataclass
class _SampleRequest:
    """A queued or running sample request. Its future stays pending until it is settled (never marked
    running), so a caller's `cancel()` succeeds at any time and the worker drops its rows at the next step."""

    prompt: list[int]
    params: SamplingParams
    num_samples: int
    stop_checker: StopChecker
    future: concurrent.futures.Future[SampleResult]
    sequences: list[SampledSequence | None] = field(default_factory=list)
    on_token: Callable[[TokenEvent], object] | None = None


@dataclass
class _Row:
    """One sequence being sampled; its newest token is not yet in the KV cache."""

    request: _SampleRequest
    sample_index: int
    sampling: RowSampling
    cached_tokens: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)


@dataclass
class _Call:
    """Work for the worker thread that is not sampling: a weight update or a scoring request."""

    run: Callable[[], Any]
    future: concurrent.futures.Future[Any]


_CLOSE = object()


class HFSampler:
    """A `TokenSampler` over a transformers causal LM with continuous batching.

    max_batch_size: most sequences decoded together (a request with n samples takes n).
    max_prefill_tokens: most (padded) prompt tokens prefilled in one forward pass.
    seed: seeds the generator shared by requests that bring no seed of their own.
    Raises UnsupportedArchitectureError for a model it cannot serve exactly (see the module docs).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        max_batch_size: int = 64,
        max_prefill_tokens: int = 16384,
        max_context: int | None = None,
        seed: int | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model.eval()
        self._layout = CacheLayout.of(self.model)
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        config_context = getattr(model.config, "max_position_embeddings", None) or 2048
        self._max_context = int(max_context or config_context)
        self._vocab_size = int(model.config.vocab_size)
        self._device = next(model.parameters()).device
        self._pad_id = self._pick_pad_id(model, tokenizer)
        self._default_stop_ids = self._eos_ids(model, tokenizer)
        self._shared_generator = torch.Generator(device=self._device)
        if seed is None:
            self._shared_generator.seed()
        else:
            self._shared_generator.manual_seed(seed)
        self._weights = WeightLoader(model)
        self._policy_version = 0
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._waiting: deque[_SampleRequest] = deque()
        self._rows: list[_Row] = []
        self._kv: KVBatch | None = None
        self._closed = False
        self._worker = threading.Thread(target=self._serve, name="agl-hf-sampler", daemon=True)
        self._worker.start()

    @classmethod
    def from_pretrained(
        cls, name_or_path: str, *, device: str | None = None, dtype: torch.dtype | None = None, **kwargs: Any
    ) -> HFSampler:
        """Load a model and tokenizer (`tiny`, a local path, or a hub id) and start a sampler."""
        from agl_bridge.models.loading import load_causal_lm, load_tokenizer

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = load_causal_lm(name_or_path, device=device, dtype=dtype)
        return cls(model, load_tokenizer(name_or_path), **kwargs)

    # ----------------------------------------------------------------- public API

    @property
    def policy_version(self) -> int:
        """The version of the weights new tokens are sampled with."""
        return self._policy_version

    @property
    def max_context(self) -> int:
        """Most tokens (prompt + sampled) one sequence may have."""
        return self._max_context

    @property
    def running_sequences(self) -> int:
        """How many sequences are being sampled now: a gauge for monitoring (read without a lock)."""
        return len(self._rows)

    @property
    def vocab_size(self) -> int:
        """Size of the model's output vocabulary."""
        return self._vocab_size

    def submit(
        self,
        prompt_tokens: Sequence[int],
        params: SamplingParams,
        num_samples: int = 1,
        *,
        on_token: Callable[[TokenEvent], object] | None = None,
    ) -> concurrent.futures.Future[SampleResult]:
        """Queue a sample request and return a future; cancelling it frees its batch slots.

        `on_token`, if given, is called from the sampler's worker thread for every token as it is
        sampled; keep it cheap (hand the event to another thread or loop).
        """
        request = self._make_request(prompt_tokens, params, num_samples)
        request.on_token = on_token
        self._put(request)
        return request.future

    def sample(self, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int = 1) -> SampleResult:
        """Sample `num_samples` continuations of `prompt_tokens`, blocking until all are done."""
        return self.submit(prompt_tokens, params, num_samples).result()

    async def sample_async(
        self, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int = 1
    ) -> SampleResult:
        """Async form of `sample`; cancelling the awaiting task cancels the request."""
        return await asyncio.wrap_future(self.submit(prompt_tokens, params, num_samples))

    async def sample_stream(
        self, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int = 1
    ) -> AsyncIterator[TokenEvent | SampleResult]:
        """Yield a TokenEvent per token as it is sampled, then the SampleResult; leaving early cancels."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[TokenEvent | None] = asyncio.Queue()
        future = self.submit(
            prompt_tokens,
            params,
            num_samples,
            on_token=lambda event: loop.call_soon_threadsafe(events.put_nowait, event),
        )
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(events.put_nowait, None))
        try:
            while (event := await events.get()) is not None:
                yield event
            yield future.result()
        finally:
            future.cancel()

    def compute_logprobs(self, token_ids: Sequence[int]) -> list[float | None]:
        """Raw logprob of each token given the tokens before it; the first entry is None."""
        return self._call(lambda: self._score(list(token_ids))).result()

    async def compute_logprobs_async(self, token_ids: Sequence[int]) -> list[float | None]:
        """Async form of `compute_logprobs`."""
        return await asyncio.wrap_future(self._call(lambda: self._score(list(token_ids))))

    def compute_top_logprobs(self, token_ids: Sequence[int], k: int, start: int) -> list[list[tuple[int, float]]]:
        """For each position from `start` on, the k most likely tokens there and their raw logprobs.

        Scored with the weights current at call time, which can differ from the ones that sampled
        the tokens if a swap happened in between.
        """
        return self._call(lambda: self._top_logprobs(list(token_ids), k, start)).result()

    async def compute_top_logprobs_async(
        self, token_ids: Sequence[int], k: int, start: int
    ) -> list[list[tuple[int, float]]]:
        """Async form of `compute_top_logprobs`."""
        return await asyncio.wrap_future(self._call(lambda: self._top_logprobs(list(token_ids), k, start)))

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> int:
        """Copy full weights in between decode steps; returns the new policy version."""
        return self._call(lambda: self._swap(lambda: self._weights.load_full(state_dict), version)).result()

    def load_lora(self, state_dict: Mapping[str, torch.Tensor], scaling: float, version: int | None = None) -> int:
        """Merge a peft LoRA adapter (replacing the previous one) between decode steps; returns the new version."""
        return self._call(lambda: self._swap(lambda: self._weights.load_lora(state_dict, scaling), version)).result()

    def close(self) -> None:
        """Stop the worker; requests still waiting fail with SamplerClosedError."""
        if self._closed:
            return
        self._closed = True
        self._inbox.put(_CLOSE)
        self._worker.join(timeout=30)

    def __enter__(self) -> HFSampler:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ----------------------------------------------------------------- request intake

    def _make_request(self, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int) -> _SampleRequest:
        prompt = checked_prompt(
            prompt_tokens,
            params,
            num_samples,
            vocab_size=self._vocab_size,
            max_context=self._max_context,
            max_batch_size=self.max_batch_size,
        )
        room = self._max_context - len(prompt)
        max_new = min(params.max_tokens or room, room)
        stop_ids = self._default_stop_ids if params.stop is None else params.stop_token_ids
        decode = None if self.tokenizer is None else self._decode_for_stops
        checker = StopChecker(
            stop_token_ids=stop_ids, stop_strings=params.stop_strings, max_new_tokens=max_new, decode=decode
        )
        return _SampleRequest(prompt, params, num_samples, checker, concurrent.futures.Future(), [None] * num_samples)

    def _decode_for_stops(self, tokens: list[int]) -> str:
        assert self.tokenizer is not None
        return cast(str, self.tokenizer.decode(tokens, skip_special_tokens=False))  # a str for one list of ids

    def _call(self, run: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        call = _Call(run, concurrent.futures.Future())
        self._put(call)
        return call.future

    def _put(self, item: _SampleRequest | _Call) -> None:
        if self._closed:
            raise SamplerClosedError("the sampler is closed; create a new one")
        self._inbox.put(item)

    # ----------------------------------------------------------------- worker thread

    def _serve(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            idle = not self._rows and not self._waiting
            try:
                item = self._inbox.get() if idle else self._inbox.get_nowait()
            except queue.Empty:
                item = None
            while item is not None:
                if item is _CLOSE:
                    self._fail_everything(SamplerClosedError("the sampler was closed"))
                    return
                self._accept(item)
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    item = None
            try:
                self._drop_cancelled()
                self._admit_waiting()
                if self._rows:
                    self._decode_step()
            except Exception as error:  # a failed forward must not kill the worker
                logger.exception("sampler step failed; failing the requests in the batch")
                self._fail_running(error)

    def _accept(self, item: _SampleRequest | _Call) -> None:
        if isinstance(item, _SampleRequest):
            self._waiting.append(item)
            return
        if not item.future.set_running_or_notify_cancel():
            return
        try:
            item.future.set_result(item.run())
        except Exception as error:
            item.future.set_exception(error)

    def _swap(self, apply: Callable[[], None], version: int | None) -> int:
        apply()
        self._policy_version = self._policy_version + 1 if version is None else int(version)
        return self._policy_version

    def _score(self, tokens: list[int]) -> list[float | None]:
        if len(tokens) > self._max_context:
            raise ContextLengthError(len(tokens), self._max_context)
        if not tokens:
            return []
        input_ids = torch.tensor([tokens], device=self._device)
        logits = self.model(input_ids=input_ids, use_cache=False).logits[0, :-1].float()
        logprobs = torch.log_softmax(logits, dim=-1).gather(1, input_ids[0, 1:].unsqueeze(1)).squeeze(1)
        return [None, *logprobs.tolist()]

    def _top_logprobs(self, tokens: list[int], k: int, start: int) -> list[list[tuple[int, float]]]:
        if not 1 <= start < len(tokens) <= self._max_context:
            raise ValueError(f"start must be in 1..{len(tokens) - 1} and the sequence fit the context")
        logits = self.model(input_ids=torch.tensor([tokens], device=self._device), use_cache=False).logits
        logprobs = torch.log_softmax(logits[0, start - 1 : -1].float(), dim=-1)
        values, indices = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
        return [list(zip(i.tolist(), v.tolist(), strict=True)) for i, v in zip(indices, values, strict=True)]

    def _admit_waiting(self) -> None:
        free = self.max_batch_size - len(self._rows)
        batch: list[_SampleRequest] = []
        longest = 0
        while self._waiting and self._waiting[0].num_samples <= free:
            request = self._waiting[0]
            if request.future.cancelled():
                self._waiting.popleft()
                continue
            padded = max(longest, len(request.prompt)) * (len(batch) + 1)
            if batch and padded > self.max_prefill_tokens:
                break
            self._waiting.popleft()
            batch.append(request)
            free -= request.num_samples
            longest = max(longest, len(request.prompt))
        if batch:
            self._prefill(batch, longest)

    def _prefill(self, batch: list[_SampleRequest], longest: int) -> None:
        input_ids = torch.full((len(batch), longest), self._pad_id, dtype=torch.long, device=self._device)
        attention_mask = torch.zeros((len(batch), longest), dtype=torch.long, device=self._device)
        for i, request in enumerate(batch):
            n = len(request.prompt)
            input_ids[i, longest - n :] = torch.tensor(request.prompt, device=self._device)
            attention_mask[i, longest - n :] = 1
        position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
        output = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=self._layout.new_cache(),
            use_cache=True,
            logits_to_keep=1,
        )
        counts = [request.num_samples for request in batch]
        kv = KVBatch(self._layout, output.past_key_values, attention_mask).repeat_rows(counts)
        row_index = torch.repeat_interleave(
            torch.arange(len(batch), device=self._device), torch.tensor(counts, device=self._device)
        )
        logits = output.logits[:, -1, :].index_select(0, row_index)
        new_rows = [
            _Row(request, i, self._row_sampling(request.params, i), cached_tokens=len(request.prompt))
            for request in batch
            for i in range(request.num_samples)
        ]
        self._kv = kv if self._kv is None else self._kv.concat(kv)
        self._rows.extend(new_rows)
        self._append_tokens(logits, new_rows, first_row=len(self._rows) - len(new_rows))

    def _decode_step(self) -> None:
        assert self._kv is not None
        input_ids = torch.tensor([[row.tokens[-1]] for row in self._rows], device=self._device)
        position_ids = torch.tensor([[row.cached_tokens] for row in self._rows], device=self._device)
        ones = torch.ones((len(self._rows), 1), dtype=self._kv.attention_mask.dtype, device=self._device)
        attention_mask = torch.cat([self._kv.attention_mask, ones], dim=1)
        output = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=self._kv.cache,
            use_cache=True,
        )
        self._kv = KVBatch(self._layout, output.past_key_values, attention_mask)
        for row in self._rows:
            row.cached_tokens += 1
        self._append_tokens(output.logits[:, -1, :], self._rows, first_row=0)

    def _append_tokens(self, logits: torch.Tensor, rows: list[_Row], first_row: int) -> None:
        """Sample one token for each of `rows` (batch rows first_row...), then retire finished rows."""
        tokens, logprobs = choose_tokens(logits, [row.sampling for row in rows], self._shared_generator)
        finished: list[int] = []
        complete: list[_SampleRequest] = []
        for offset, (row, token, logprob) in enumerate(zip(rows, tokens.tolist(), logprobs.tolist(), strict=True)):
            row.tokens.append(token)
            row.logprobs.append(logprob)
            row.versions.append(self._policy_version)
            if not self._notify(row, TokenEvent(row.sample_index, token, logprob, self._policy_version)):
                finished.append(first_row + offset)
                continue
            reason = row.request.stop_checker.check(row.tokens)
            if reason is not None:
                if self._finish(row, reason):
                    complete.append(row.request)
                finished.append(first_row + offset)
        if finished:
            self._remove_rows(set(finished))
        for request in complete:  # after their rows are gone: a caller holding its result sees them gone too
            settle_future(request.future, SampleResult(list(request.prompt), list(request.sequences)))  # type: ignore[arg-type]

    @staticmethod
    def _notify(row: _Row, event: TokenEvent) -> bool:
        """Hand a token to the request's listener; False (and the request failed) if it cannot take it."""
        request = row.request
        if request.on_token is None:
            return True
        if request.future.done():
            return False
        try:
            request.on_token(event)
        except Exception as error:  # e.g. the listener's event loop closed: only this request fails
            settle_future(request.future, error=error)
            return False
        return True

    def _finish(self, row: _Row, reason: StopReason) -> bool:
        """Keep the row's sequence; whether it was its request's last."""
        request = row.request
        request.sequences[row.sample_index] = SampledSequence(
            tokens=row.tokens,
            logprobs=row.logprobs,
            stop_reason=reason,
            token_policy_versions=row.versions,
        )
        return all(s is not None for s in request.sequences)

    def _drop_cancelled(self) -> None:
        gone = {i for i, row in enumerate(self._rows) if row.request.future.cancelled()}
        if gone:
            self._remove_rows(gone)

    def _remove_rows(self, gone: set[int]) -> None:
        keep = [i for i in range(len(self._rows)) if i not in gone]
        self._rows = [self._rows[i] for i in keep]
        if not keep:
            self._kv = None
            return
        assert self._kv is not None
        self._kv = self._kv.select(torch.tensor(keep, device=self._device)).trim_left()

    def _row_sampling(self, params: SamplingParams, sample_index: int) -> RowSampling:
        generator = None
        if params.seed is not None and params.temperature != 0:
            generator = torch.Generator(device=self._device).manual_seed(params.seed + sample_index)
        return RowSampling(params.temperature, params.top_k, params.top_p, generator)

    def _fail_running(self, error: Exception) -> None:
        for row in self._rows:
            settle_future(row.request.future, error=error)
        self._rows, self._kv = [], None

    def _fail_everything(self, error: Exception) -> None:
        self._fail_running(error)
        while self._waiting:
            settle_future(self._waiting.popleft().future, error=error)
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, (_SampleRequest, _Call)):
                settle_future(item.future, error=error)

    @staticmethod
    def _pick_pad_id(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> int:
        for candidate in (
            getattr(tokenizer, "pad_token_id", None),
            getattr(model.config, "pad_token_id", None),
            getattr(tokenizer, "eos_token_id", None),
        ):
            if isinstance(candidate, int):
                return candidate
        return 0

    @staticmethod
    def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> tuple[int, ...]:
        ids: list[int] = []
        generation_config = getattr(model, "generation_config", None)
        for source in (getattr(generation_config, "eos_token_id", None), getattr(model.config, "eos_token_id", None)):
            if isinstance(source, int):
                ids.append(source)
            elif isinstance(source, (list, tuple)):
                ids.extend(int(t) for t in source)
        if tokenizer is not None and isinstance(tokenizer.eos_token_id, int):
            ids.append(tokenizer.eos_token_id)
        return tuple(dict.fromkeys(ids))


def settle_future(
    future: concurrent.futures.Future[Any], result: Any = None, error: BaseException | None = None
) -> None:
    """Give `future` its result or error, unless it is done: its caller may cancel it from another thread
    at any moment (sample requests stay pending while they run), and a cancelled future takes neither."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass
