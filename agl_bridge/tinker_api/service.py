"""The Tinker API's state: sessions, training runs over `TrainingClient`, sampling sessions over pinned
snapshots (held since they were saved, or read back from the root after a restart), and each run's calls
executed in the order the SDK numbered them.

Everything here runs on the server's event loop; training calls run on each client's own worker
thread (queued in `seq_id` order), model loading and weight switches on worker threads.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import logging
import secrets
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agl_bridge.models.loading import load_causal_lm, load_tokenizer, resolve_model_path
from agl_bridge.primitives.checkpoint import CheckpointMismatchError
from agl_bridge.primitives.client import AdamParams, SamplerWeights, TrainingClient
from agl_bridge.primitives.lora import untie_output_embeddings
from agl_bridge.primitives.losses import get_loss
from agl_bridge.sampler.adapter_files import AdapterFileError, read_peft_adapter
from agl_bridge.sampler.base import SamplingParams
from agl_bridge.sampler.hf import HFSampler
from agl_bridge.tinker_api.checkpoints import (
    CheckpointPath,
    CheckpointPathError,
    check_name,
    read_run_file,
    write_run_file,
)
from agl_bridge.tinker_api.futures import FutureTable, Outcome
from agl_bridge.tinker_api.gate import SamplerGate
from agl_bridge.tinker_api.signed_weights import has_negative_weights, signed_cross_entropy, signed_loss
from agl_bridge.tinker_api.stability import StabilityRecord
from agl_bridge.tinker_api.wire import ForwardBackwardCall, encode_forward_backward, encode_sample, metric_key

log = logging.getLogger(__name__)

# transformers' model loading is not safe in two threads at once (its init contexts are process-wide: a
# concurrent load can leave parameters on the meta device), so the server loads one model at a time.
_LOADING = threading.Lock()

_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


class UserError(ValueError):
    """A request this server refuses; the message says what to change (the SDK's "user" category)."""


def outcome_of_error(error: BaseException) -> Outcome:
    """A failed call as the SDK reads it: our refusals (ValueError and kin) are "user" errors."""
    if isinstance(error, ValueError):
        return Outcome(error=f"{type(error).__name__}: {error}", category="user")
    log.error("tinker API call failed", exc_info=error)
    return Outcome(error=f"{type(error).__name__}: {error}", category="server")


@dataclass
class ModelMap:
    """Model names as recipes use them (`Qwen/Qwen3-8B`) → what this server loads (`tiny`, a path, a hub id).

    A name not in the map is loaded as itself when it resolves here (`tiny`, a local directory, a hub id
    in the local cache).
    """

    names: dict[str, str] = field(default_factory=dict)

    def resolve(self, name: str) -> str:
        """The local model directory behind `name`; UserError naming the map when it cannot be found."""
        target = self.names.get(name, name)
        try:
            return str(resolve_model_path(target))
        except (OSError, ValueError) as exc:
            mapped = f" (mapped to {target!r})" if target != name else ""
            raise UserError(
                f"base model {name!r}{mapped} is not available on this server: {exc}. Map the name to a local "
                "model with --model NAME=PATH (e.g. --model Qwen/Qwen3-8B=tiny)"
            ) from None


@dataclass
class Snapshot:
    """Weights a sampling session samples with: a training run's state when it was saved for sampling."""

    key: str
    weights: SamplerWeights


class TrainingRun:
    """One training client of the API (a `model_id`): its calls in seq order, its sampler and snapshots."""

    def __init__(self, model_id: str, base_name: str, lora: dict[str, Any], futures: FutureTable) -> None:
        self.model_id = model_id
        self.base_name = base_name
        self.lora = lora
        self.client: TrainingClient | None = None
        self.gate: SamplerGate | None = None
        self.base_path = ""
        self.last_request = datetime.datetime.now(datetime.UTC)
        self._futures = futures
        self._next_seq = 1  # creating the model is call 0
        self._pending: dict[int, tuple[str, Callable[[], Awaitable[Outcome]]] | None] = {}  # None: refused
        self._request_of_seq: dict[int, str] = {}
        self._snapshots: OrderedDict[str, Snapshot] = OrderedDict()
        self._named: set[str] = set()
        self._snapshot_ids = itertools.count(1)
        self.latest: Snapshot | None = None

    def ready(self, client: TrainingClient, gate: SamplerGate, base_path: str) -> None:
        """The client is built: start running the calls that arrived meanwhile."""
        self.client, self.gate, self.base_path = client, gate, base_path
        self._pump()

    def submit(self, seq_id: int, kind: str, start: Callable[[], Awaitable[Outcome]]) -> str:
        """Queue call `seq_id`; `start` hands the work to the client when its turn comes (synchronously) and
        returns what to await for its outcome. The same seq_id twice (an SDK retry) gives the same request."""
        self.last_request = datetime.datetime.now(datetime.UTC)
        if seq_id in self._request_of_seq:
            return self._request_of_seq[seq_id]
        if seq_id < self._next_seq:
            raise UserError(f"seq_id {seq_id} of {self.model_id} has already run; the next one is {self._next_seq}")
        request_id = self._futures.create(kind)
        self._request_of_seq[seq_id] = request_id
        self._pending[seq_id] = (request_id, start)
        self._pump()
        return request_id

    @contextmanager
    def refusing(self, seq_id: int) -> Iterator[None]:
        """Around a call's checks: a call refused before it is queued still takes its turn (as a no-op), or
        every later call of this client, numbered after it by the SDK, would wait for it forever."""
        try:
            yield
        except Exception:
            if seq_id not in self._request_of_seq and seq_id >= self._next_seq:
                self._request_of_seq[seq_id] = ""
                self._pending[seq_id] = None
                self._pump()
            raise

    def snapshot(self, key: str) -> Snapshot | None:
        """A snapshot this run holds in memory by key (None: not saved by this process, or superseded)."""
        return self._snapshots.get(key)

    def add_snapshot(self, weights: SamplerWeights, name: str | None, *, keep_unnamed: int = 4) -> Snapshot:
        """Register weights saved for sampling (named ones stay; only the newest unnamed ones are kept)."""
        key = name or f"{self.model_id}:snapshot:{next(self._snapshot_ids)}"
        snapshot = Snapshot(key, weights)
        self._snapshots[key] = snapshot
        if name is not None:
            self._named.add(key)
        unnamed = [k for k in self._snapshots if k not in self._named]
        for stale in unnamed[:-keep_unnamed]:
            del self._snapshots[stale]
        self.latest = snapshot
        return snapshot

    def _pump(self) -> None:
        if self.client is None:
            return
        while self._next_seq in self._pending:
            queued = self._pending.pop(self._next_seq)
            self._next_seq += 1
            if queued is None:
                continue
            request_id, start = queued
            try:
                awaitable = start()
            except Exception as error:  # a refusal before anything was queued
                self._futures.finish(request_id, outcome_of_error(error))
                continue
            asyncio.ensure_future(self._finish(request_id, awaitable))

    async def _finish(self, request_id: str, awaitable: Awaitable[Outcome]) -> None:
        try:
            outcome = await awaitable
        except Exception as error:
            outcome = outcome_of_error(error)
        self._futures.finish(request_id, outcome)


@dataclass
class SamplingSession:
    """What a sampling client samples from: a run's pinned snapshot, a run's newest weights, weights read
    back from the root (`gate`: the sampler they take turns on), or a base model."""

    session_id: str
    base_name: str
    model_path: str | None
    run: TrainingRun | None = None
    snapshot: Snapshot | None = None  # None with a run: follow its newest weights ("inflight")
    base_sampler: HFSampler | None = None
    gate: SamplerGate | None = None


class TinkerService:
    """The API's state and the work behind each route (the routes only parse and answer)."""

    def __init__(self, root: Path, models: ModelMap, *, device: str | None = None, poll_s: float = 25.0) -> None:
        self.root = root
        self.models = models
        self.futures = FutureTable(poll_s=poll_s)
        self.stability = StabilityRecord()
        self._device = device
        self._sessions: dict[str, dict[str, list[str]]] = {}
        self._session_ids = itertools.count(1)
        self._process_id = secrets.token_hex(4)
        self.runs: dict[str, TrainingRun] = {}
        self.samplers: dict[str, SamplingSession] = {}
        self._base_samplers: dict[str, HFSampler] = {}
        # Sampler weights read from disk: by path (sessions on one path share its tensors), and the samplers
        # they are sampled with, one per base model (untied or not).
        self._stored: dict[str, Snapshot] = {}
        self._stored_gates: dict[tuple[str, bool], SamplerGate] = {}

    # ------------------------------------------------------------------ sessions

    def create_session(self) -> str:
        """A new session id."""
        # The process's own prefix: a restarted server on the same root must not reuse an earlier run's id
        # (model ids name checkpoint folders).
        session_id = f"session-{self._process_id}-{next(self._session_ids)}"
        self._sessions[session_id] = {"training_run_ids": [], "sampler_ids": []}
        return session_id

    def session(self, session_id: str) -> dict[str, list[str]]:
        """A session's runs and samplers; UserError when unknown."""
        found = self._sessions.get(session_id)
        if found is None:
            raise UserError(f"unknown session {session_id!r}; create one with create_session")
        return found

    # ------------------------------------------------------------------ training runs

    def create_model(self, session_id: str, model_seq_id: int, base_model: str, lora: Mapping[str, Any]) -> str:
        """Start building a LoRA training client; the future's result is its model_id."""
        settings = {
            "base_model": base_model,
            "rank": int(lora.get("rank", 32)),
            "seed": lora.get("seed"),
            "train_mlp": bool(lora.get("train_mlp", True)),
            "train_attn": bool(lora.get("train_attn", True)),
            "train_unembed": bool(lora.get("train_unembed", True)),
        }
        run = self._new_run(session_id, model_seq_id, base_model, settings)
        write_run_file(self.root, run.model_id, settings)
        return self._build(run, load=None)

    def load_into_new_model(
        self, session_id: str, model_seq_id: int, path: str, *, optimizer: bool, base_model: str | None
    ) -> str:
        """Create a training client from a saved state ("create via load"); the result names the model."""
        checkpoint = CheckpointPath.parse(path)
        settings = read_run_file(self.root, checkpoint.model_id)
        if base_model and base_model != settings["base_model"]:
            raise UserError(f"{path} was trained on {settings['base_model']!r}, not {base_model!r}")
        run = self._new_run(session_id, model_seq_id, settings["base_model"], settings)
        write_run_file(self.root, run.model_id, settings)
        return self._build(run, load=(self._existing(checkpoint), optimizer))

    def run(self, model_id: str) -> TrainingRun:
        """A training run by id; UserError when unknown."""
        found = self.runs.get(model_id)
        if found is None:
            raise UserError(f"unknown model_id {model_id!r}; create it with create_lora_training_client")
        return found

    def info(self, model_id: str) -> dict[str, Any]:
        """`get_info`: the model's name, tokenizer (a local directory: nothing is downloaded) and LoRA rank."""
        run = self.run(model_id)
        assert run.client is not None, "get_info follows create_model's result"
        model_type = getattr(run.client.model.config, "model_type", "unknown")
        return {
            "model_id": model_id,
            "model_data": {"model_name": run.base_name, "tokenizer_id": run.base_path, "arch": model_type},
            "model_name": run.base_name,
            "is_lora": True,
            "lora_rank": run.lora["rank"],
            "optimizer_config": {"type": "adamw"},
        }

    def forward_backward(self, call: ForwardBackwardCall) -> str:
        """Queue forward (or forward + backward) in seq order; the result is protobuf."""
        run = self.run(call.model_id)
        loss_fn, config = call.loss_fn, call.loss_fn_config
        with run.refusing(call.seq_id):
            if loss_fn or not call.forward_only:
                get_loss(loss_fn)  # an unknown loss is refused now (400), naming the known ones
            data = call.data
            if loss_fn == "stable_reinforce":
                # Behaviour logprobs from this server's record of the samples, never from the client.
                data = [
                    self.stability.resolve(index, datum, spans)
                    for index, (datum, spans) in enumerate(zip(call.data, call.provenance, strict=True))
                ]

        def start() -> Awaitable[Outcome]:
            client = _client(run)
            if call.forward_only:
                future = client.forward_async(data, loss_fn or None, config or None)
            elif loss_fn == "cross_entropy" and not config and has_negative_weights(data):
                future = client.forward_backward_custom_async(signed_cross_entropy(data), signed_loss)
            else:
                future = client.forward_backward_async(data, loss_fn, config or None)

            async def outcome() -> Outcome:
                output = await future
                logprobs = [item["logprobs"] for item in output.loss_fn_outputs]
                return Outcome(proto=encode_forward_backward(logprobs, output.metrics))

            return outcome()

        return run.submit(call.seq_id, "forward" if call.forward_only else "forward_backward", start)

    def optim_step(self, model_id: str, seq_id: int, adam: Mapping[str, Any]) -> str:
        """Queue an AdamW step with the client's own parameters (the SDK's defaults, not ours)."""
        run = self.run(model_id)
        with run.refusing(seq_id):
            clip = adam.get("grad_clip_norm")
            params = AdamParams(
                learning_rate=float(adam.get("learning_rate", 1e-4)),
                beta1=float(adam.get("beta1", 0.9)),
                beta2=float(adam.get("beta2", 0.95)),
                eps=float(adam.get("eps", 1e-12)),
                weight_decay=float(adam.get("weight_decay", 0.0)),
                grad_clip_norm=float(clip) if clip else None,
            )
            params.validate()

        def start() -> Awaitable[Outcome]:
            future = _client(run).optim_step_async(params)

            async def outcome() -> Outcome:
                result = await future
                return Outcome(json={"metrics": {metric_key(k): v for k, v in result.metrics.items()}})

            return outcome()

        return run.submit(seq_id, "optim_step", start)

    def save_state(self, model_id: str, seq_id: int, name: str) -> str:
        """Queue `save_state` under `tinker://<model_id>/weights/<name>`."""
        run = self.run(model_id)
        with run.refusing(seq_id):
            path = CheckpointPath(model_id, "weights", check_name(name))

        def start() -> Awaitable[Outcome]:
            future = _client(run).save_state_async(path.directory(self.root))

            async def outcome() -> Outcome:
                await future
                return Outcome(json={"path": str(path)})

            return outcome()

        return run.submit(seq_id, "save_weights", start)

    def load_state(self, model_id: str, seq_id: int, path: str, *, optimizer: bool) -> str:
        """Queue loading a saved state into an existing run (the SDK's older `load_state`)."""
        run = self.run(model_id)
        with run.refusing(seq_id):
            directory = self._existing(CheckpointPath.parse(path))

        def start() -> Awaitable[Outcome]:
            future = _client(run).load_state_async(directory, optimizer=optimizer)

            async def outcome() -> Outcome:
                await future
                return Outcome(json={"path": path, "model_id": model_id})

            return outcome()

        return run.submit(seq_id, "load_weights", start)

    def save_for_sampler(
        self, model_id: str, seq_id: int, *, name: str | None, sampling_seq_id: int | None, follow: bool
    ) -> str:
        """Queue a snapshot of the weights for sampling: named (a `sampler_weights` checkpoint on disk) or
        not (a new sampling session on it, pinned, or following the newest weights when `follow`)."""
        run = self.run(model_id)
        with run.refusing(seq_id):
            path = CheckpointPath(model_id, "sampler_weights", check_name(name)) if name is not None else None
        session_id = model_id.split(":train:")[0]

        def start() -> Awaitable[Outcome]:
            client = _client(run)
            saved = client.save_weights_for_sampler_async(path.directory(self.root)) if path else None
            weights_future = client.sampler_weights_async()

            async def outcome() -> Outcome:
                if saved is not None:
                    await saved
                snapshot = run.add_snapshot(await weights_future, str(path) if path else None)
                if path is not None:
                    return Outcome(json={"path": str(path)})
                sampler_id = f"{session_id}:sample:{sampling_seq_id}"
                self.samplers[sampler_id] = SamplingSession(
                    sampler_id, run.base_name, None, run=run, snapshot=None if follow else snapshot
                )
                return Outcome(json={"sampling_session_id": sampler_id})

            return outcome()

        return run.submit(seq_id, "save_weights_for_sampler", start)

    # ------------------------------------------------------------------ sampling

    async def create_sampling_session(
        self, session_id: str, sampling_seq_id: int, *, base_model: str | None, model_path: str | None
    ) -> str:
        """A sampling session on saved sampler weights (`model_path`) or on a base model."""
        sampler_id = f"{session_id}:sample:{sampling_seq_id}"
        if model_path:
            checkpoint = CheckpointPath.parse(model_path)
            if checkpoint.kind != "sampler_weights":
                raise UserError(
                    f"{model_path} is a training state, not weights to sample with; sample from the sampler_weights "
                    "path save_weights_for_sampler returns (or load this state into a training client and save it "
                    "for sampling)"
                )
            run = self.runs.get(checkpoint.model_id)
            held = run.snapshot(str(checkpoint)) if run is not None else None
            if run is not None and held is not None:
                session = SamplingSession(sampler_id, run.base_name, model_path, run=run, snapshot=held)
            else:
                session = await self._stored_session(sampler_id, checkpoint)
        elif base_model:
            sampler = await self._base_sampler(base_model)
            session = SamplingSession(sampler_id, base_model, None, base_sampler=sampler)
        else:
            raise UserError("create_sampling_session needs base_model or model_path")
        self.samplers[sampler_id] = session
        self.session(session_id)["sampler_ids"].append(sampler_id)
        return sampler_id

    def sampling_session(self, sampler_id: str) -> SamplingSession:
        """A sampling session by id; UserError when unknown."""
        found = self.samplers.get(sampler_id)
        if found is None:
            raise UserError(f"unknown sampling session {sampler_id!r}")
        return found

    def sample(
        self,
        sampler_id: str,
        prompt: list[int],
        params: SamplingParams,
        num_samples: int,
        prompt_logprobs: bool,
        *,
        record: bool = False,
    ) -> str:
        """Start sampling; the result is protobuf. Refusals come back at once (before a request id). With
        `record`, the sequences are kept for stable_reinforce under their `sequence_ids`."""
        session = self.sampling_session(sampler_id)
        if not prompt:
            raise UserError("prompt: no tokens; a prompt needs at least one token")
        if not 1 <= num_samples <= 1024:
            raise UserError(f"num_samples must be between 1 and 1024, got {num_samples}")
        params.validate()
        request_id = self.futures.create("sample")
        asyncio.ensure_future(self._sample(request_id, session, prompt, params, num_samples, prompt_logprobs, record))
        return request_id

    async def _sample(
        self,
        request_id: str,
        session: SamplingSession,
        prompt: list[int],
        params: SamplingParams,
        num_samples: int,
        prompt_logprobs: bool,
        record: bool,
    ) -> None:
        try:
            if session.base_sampler is not None:
                result, scores = await _sample_with(session.base_sampler, prompt, params, num_samples, prompt_logprobs)
            else:
                run = session.run
                gate = session.gate or (run.gate if run is not None else None)
                snapshot = session.snapshot or (run.latest if run is not None else None)
                assert gate is not None, "a session on trained weights has a run's gate or its own"
                if snapshot is None:
                    raise UserError(f"{session.base_name} has saved no weights for sampling yet")
                async with gate.holding(snapshot.key, snapshot.weights) as sampler:
                    result, scores = await _sample_with(sampler, prompt, params, num_samples, prompt_logprobs)
            if record:
                for sequence_id, sequence in zip(sequence_ids(request_id, num_samples), result.sequences, strict=True):
                    self.stability.add(sequence_id, sequence.tokens, sequence.logprobs)
            outcome = Outcome(proto=encode_sample(result, scores))
        except Exception as error:
            outcome = outcome_of_error(error)
        self.futures.finish(request_id, outcome)

    # ------------------------------------------------------------------ internals

    def _new_run(self, session_id: str, model_seq_id: int, base_model: str, settings: dict[str, Any]) -> TrainingRun:
        # The SDK computes this id itself when it creates a model from a checkpoint: the format is fixed.
        model_id = f"{session_id}:train:{model_seq_id}"
        if model_id in self.runs:
            raise UserError(f"model {model_id} exists already (model_seq_id {model_seq_id} was used)")
        self.session(session_id)["training_run_ids"].append(model_id)
        run = TrainingRun(model_id, base_model, settings, self.futures)
        self.runs[model_id] = run
        return run

    def _build(self, run: TrainingRun, load: tuple[Path, bool] | None) -> str:
        request_id = self.futures.create("create_model")
        base_path = self.models.resolve(run.base_name)

        def build() -> tuple[TrainingClient, SamplerGate]:
            with _LOADING:
                return construct()

        def construct() -> tuple[TrainingClient, SamplerGate]:
            client = TrainingClient(
                base_path,
                lora_rank=run.lora["rank"],
                target_modules=_targets(run.lora),
                train_unembedding=run.lora["train_unembed"],
                seed=run.lora["seed"] or 0,
                device=self._device,
            )
            if load is not None:
                client.load_state(load[0], optimizer=load[1])
            model = load_causal_lm(base_path, device=str(client.device))
            if run.lora["train_unembed"]:
                untie_output_embeddings(model)
            return client, SamplerGate(HFSampler(model, load_tokenizer(base_path), seed=run.lora["seed"]))

        async def finish() -> None:
            try:
                client, gate = await asyncio.to_thread(build)
            except (CheckpointMismatchError, OSError, ValueError) as error:
                hint = (
                    "; to serve a recipe's model name from a local model, start the server with "
                    f"--model {run.base_name}=PATH"
                )
                self.futures.finish(request_id, Outcome(error=f"{error}{hint}", category="user"))
                return
            except Exception as error:
                self.futures.finish(request_id, outcome_of_error(error))
                return
            run.ready(client, gate, base_path)
            self.futures.finish(request_id, Outcome(json={"model_id": run.model_id}))

        asyncio.ensure_future(finish())
        return request_id

    async def _base_sampler(self, base_model: str) -> HFSampler:
        path = self.models.resolve(base_model)
        if path not in self._base_samplers:

            def construct() -> HFSampler:
                with _LOADING:
                    return HFSampler.from_pretrained(path, device=self._device)

            self._base_samplers[path] = await asyncio.to_thread(construct)
        return self._base_samplers[path]

    async def _stored_session(self, sampler_id: str, checkpoint: CheckpointPath) -> SamplingSession:
        # Weights saved by an earlier server process (or no longer held) are read from their folder.
        directory = checkpoint.directory(self.root)
        if not directory.is_dir():
            raise UserError(
                f"no checkpoint {checkpoint} on this server (looked in {directory}); sample from a path "
                "save_weights_for_sampler returned, on a server started with the --root it was saved under"
            )
        settings = read_run_file(self.root, checkpoint.model_id)
        key = str(checkpoint)
        if key not in self._stored:
            weights = await asyncio.to_thread(_read_sampler_weights, checkpoint, directory)
            self._stored.setdefault(key, Snapshot(key, weights))
        snapshot = self._stored[key]
        untied = any(".modules_to_save." in name for name in snapshot.weights.tensors)
        gate = await self._stored_gate(self.models.resolve(settings["base_model"]), untied)
        return SamplingSession(sampler_id, settings["base_model"], key, snapshot=snapshot, gate=gate)

    async def _stored_gate(self, base_path: str, untied: bool) -> SamplerGate:
        # Not a base-model session's sampler: that one must keep the base weights. A trained unembedding is
        # loaded into an untied copy (as in _build); an adapter without one must not meet a stale trained
        # lm_head there (a LoRA switch restores merged weights, not modules_to_save), hence two gates.
        if (base_path, untied) not in self._stored_gates:

            def construct() -> HFSampler:
                with _LOADING:
                    device = self._device or ("cuda" if torch.cuda.is_available() else "cpu")
                    model = load_causal_lm(base_path, device=device)
                    if untied:
                        untie_output_embeddings(model)
                    return HFSampler(model, load_tokenizer(base_path))

            sampler = await asyncio.to_thread(construct)
            gate = self._stored_gates.setdefault((base_path, untied), SamplerGate(sampler))
            if gate.sampler is not sampler:  # another request built one meanwhile
                sampler.close()
        return self._stored_gates[(base_path, untied)]

    def _existing(self, checkpoint: CheckpointPath) -> Path:
        directory = checkpoint.directory(self.root)
        if not directory.is_dir():
            raise CheckpointPathError(f"no checkpoint {checkpoint} on this server (looked in {directory})")
        return directory

    def close(self) -> None:
        """Stop every client and sampler."""
        for run in self.runs.values():
            if run.client is not None:
                run.client.close()
            if run.gate is not None:
                run.gate.sampler.close()
        for sampler in self._base_samplers.values():
            sampler.close()
        for gate in self._stored_gates.values():
            gate.sampler.close()


def sequence_ids(request_id: str, num_samples: int) -> list[str]:
    """The ids of a sample request's sequences, as the SDK stamps them and training spans name them."""
    return [f"{request_id}:{index}" for index in range(num_samples)]


def _client(run: TrainingRun) -> TrainingClient:
    assert run.client is not None, "calls run only once the client is built"
    return run.client


def _targets(lora: Mapping[str, Any]) -> str | list[str]:
    """The SDK's train_attn / train_mlp as module names (Qwen / Llama naming); both: every linear layer."""
    if lora["train_attn"] and lora["train_mlp"]:
        return "all-linear"
    names = [*(_ATTENTION if lora["train_attn"] else ()), *(_MLP if lora["train_mlp"] else ())]
    if not names:
        raise UserError("lora_config: train_attn and train_mlp are both false; nothing would be trained")
    return names


def _read_sampler_weights(checkpoint: CheckpointPath, directory: Path) -> SamplerWeights:
    """A `sampler_weights` folder (the peft adapter save_weights_for_sampler writes) as a snapshot's weights;
    UserError when it is not a readable LoRA adapter."""
    try:
        tensors, scaling, _ = read_peft_adapter(directory)
    except AdapterFileError as error:
        raise UserError(
            f"{checkpoint} is not a LoRA adapter this server can sample from ({error}); save the weights for "
            "sampling again with save_weights_for_sampler"
        ) from None
    return SamplerWeights(tensors, scaling)


async def _sample_with(
    sampler: HFSampler, prompt: list[int], params: SamplingParams, num_samples: int, prompt_logprobs: bool
) -> tuple[Any, list[float | None] | None]:
    result = await sampler.sample_async(prompt, params, num_samples)
    scores = await sampler.compute_logprobs_async(prompt) if prompt_logprobs else None
    return result, scores
