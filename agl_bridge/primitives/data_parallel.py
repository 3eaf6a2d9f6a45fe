"""Data-parallel training over torch.distributed: each rank scores a share of a call's datums
(balanced by tokens), the gradients are summed with one all-reduce, and every rank takes the same
AdamW step on the same sum — the numbers of one process, up to the order of float additions.

Roles. Rank 0 is the driver: it runs the training loop, the proxy, the store and the sampler sync,
exactly as a one-process run does, through a `DataParallelTrainingClient`. Every other rank is a
worker (`serve_worker`): it holds a replica of the model and its LoRA and runs the driver's calls on
its share. Losses are sums over tokens and rows are whole datums, so the sum of the ranks' losses and
gradients is the one-process loss and gradient. `forward`, `reference_logprobs`, custom losses (DPO
pairs its datums) and checkpoints run on the driver alone; the workers' gradients for a custom loss
are zero, so the step is still exact.

Sharding. `sharding="fsdp"` shards the model itself with FSDP2 (`torch.distributed.fsdp.fully_shard`,
one unit per transformer block): each rank holds 1/N of the base weights, the LoRA and the AdamW
moments, parameters are all-gathered for each block's forward and backward and gradients
reduce-scattered (summed, as above). Each rank builds its model on the CPU and keeps only its shard
on the device, so a model that fits the host's memory but not one device trains. Every pass is then
a collective: `forward` and `reference_logprobs` run on every rank too, a rank with fewer
micro-batches than the busiest runs empty passes to keep step, sampler syncs and checkpoints gather
the whole tensors on every rank, and custom losses are refused (their datums are coupled).

Channel. Calls travel through the c10d store the process group is built on, not through
collectives: a worker waits for the next call as long as the driver spends on rollouts, and a
collective's timeout would fire there. A collective (the all-reduce, a weight broadcast) starts only
once every rank has said it is at it, so a rank that died or hangs is named after `timeout_s`, not
waited for forever.

Launch: `spawn_local_group` (the driver starts its workers on this machine), `start_group` with
another starter (`agl_bridge.train.ray_ranks`: Ray tasks), or `join_group_from_env` under torchrun,
one node or several (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); see docs/scaling.md.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import hmac
import io
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, TypeVar, get_args

import torch
import torch.distributed as dist

from agl_bridge.primitives.batching import batch_groups
from agl_bridge.primitives.checkpoint import ModelIdentity
from agl_bridge.primitives.client import (
    AdamParams,
    CustomLossFn,
    ForwardBackwardOutput,
    OptimStepOutput,
    TrainingClient,
)
from agl_bridge.primitives.datum import TARGET_TOKENS, Datum
from agl_bridge.primitives.losses import get_loss, resolve_config
from agl_bridge.primitives.metrics import StepMetrics

T = TypeVar("T")

_Share = tuple[StepMetrics, list[dict[str, "torch.Tensor"]]]

DEFAULT_TIMEOUT_S = 600.0
"""How long a rank waits for another before naming it (model loading on a worker counts too)."""

WORKER_MODULE = "agl_bridge.primitives.data_parallel"
"""What `spawn_local_group` runs in each worker process (`python -m`)."""

_STOP = "stop"

Sharding = Literal["replicate", "fsdp"]
"""How a data-parallel group holds the model: a whole replica on every rank, or FSDP2 shards (module docs)."""

COMMUNICATION_KEY = "time_communication_s"
"""The forward_backward metric of a data-parallel call: seconds rank 0 spent meeting the other ranks,
summing gradients and collecting their results (waiting for the slowest rank included)."""


class DataParallelError(RuntimeError):
    """A rank of a data-parallel group failed, exited, did not answer in time, or disagrees with the driver."""


def shard_by_tokens(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Each rank's datum indices (ascending): longest datum first to the rank with the fewest tokens
    so far, ties to the lower rank — deterministic, and within one longest datum of balanced.

    A batch with fewer datums than ranks leaves some ranks empty (their gradient is zero).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    loads = [0] * world_size
    shards: list[list[int]] = [[] for _ in range(world_size)]
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        shards[rank].append(index)
        loads[rank] += lengths[index]
    return [sorted(shard) for shard in shards]


SECRET_ENV = "AGL_TRAINER_SECRET"
"""The variable that gives a rank its group's key: set by the launches here; under torchrun, set it
(the same random value) on every node, or the ranks trust whoever can reach the store's port."""


def _seal(secret: bytes, key: str, value: object) -> bytes:
    """`value` as torch's safe format, signed with the group's key for `key` (no replay under another key)."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    payload = buffer.getvalue()
    return hmac.new(secret, key.encode() + payload, hashlib.sha256).digest() + payload


def _open(secret: bytes, key: str, sealed: bytes) -> Any:
    """The value of a sealed message: its signature checked, then read with ``weights_only=True``
    (plain data and tensors; nothing in it is code, whoever wrote it)."""
    signature, payload = sealed[:32], sealed[32:]
    expected = hmac.new(secret, key.encode() + payload, hashlib.sha256).digest()
    if not hmac.compare_digest(signature, expected):
        raise DataParallelError(
            f"the message under {key!r} is not signed with this group's key: something other than its ranks "
            f"wrote to the group's store (or a rank has another {SECRET_ENV})"
        )
    return torch.load(io.BytesIO(payload), weights_only=True)


def _failed(error: BaseException) -> dict[str, str]:
    """A worker's answer when its part of a call raised."""
    return {"failed": repr(error)}


def _failure(answer: object) -> str | None:
    """What a worker's answer says went wrong, or None if it is not a failure."""
    return answer["failed"] if isinstance(answer, dict) and set(answer) == {"failed"} else None


def _datum_state(datum: Datum) -> dict[str, Any]:
    """A datum as plain data (a numpy array becomes a list: only tensors and plain data travel)."""
    inputs = {
        name: value if isinstance(value, torch.Tensor) or not hasattr(value, "tolist") else value.tolist()
        for name, value in datum.loss_fn_inputs.items()
    }
    return {"model_input": list(datum.model_input), "loss_fn_inputs": inputs}


class WorkerHandle(Protocol):
    """A worker rank a driver started (a local process, a Ray task): whether it ended, and how to end it."""

    def exit_status(self) -> str | None:
        """None while it runs; else how it ended, e.g. ``exit code -9``."""
        ...

    def finish(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for it to end (it was told to stop), then kill it."""
        ...


@dataclass
class RankGroup:
    """This process's place in a data-parallel group: its rank, the group's size, the store calls
    travel through, how long to wait for a rank, and (on a driver that started them) the workers
    and what to release after them."""

    rank: int
    world_size: int
    store: dist.Store
    timeout_s: float = DEFAULT_TIMEOUT_S
    workers: dict[int, WorkerHandle] = field(default_factory=dict)
    on_close: list[Callable[[], None]] = field(default_factory=list)
    secret: bytes = b""
    """The group's key: every message is signed with it (see `_seal`)."""

    def post(self, key: str, value: object) -> None:
        """Publish `value` (plain data and tensors only) under `key` for another rank to take."""
        self.store.set(key, _seal(self.secret, key, value))  # type: ignore[arg-type]  # the binding takes bytes

    def worker_keys(self, prefix: str) -> dict[int, str]:
        """Each worker rank's key under `prefix` (``prefix/rank``): where its answer is posted."""
        return {rank: f"{prefix}/{rank}" for rank in range(1, self.world_size)}

    def take(self, key: str, *, forever: bool = False, alive: Callable[[], bool] | None = None) -> Any:
        """The value posted under `key`, removed from the store; wait up to `timeout_s` (or, with
        `forever`, while `alive()` holds) — else DataParallelError."""
        return self.take_all({-1: key}, what=key, forever=forever, alive=alive)[-1]

    def take_all(
        self,
        keys_by_rank: dict[int, str],
        *,
        what: str,
        forever: bool = False,
        alive: Callable[[], bool] | None = None,
    ) -> dict[int, Any]:
        """Each rank's posted value, once all have posted; DataParallelError naming the ranks that
        exited or did not post `what` within `timeout_s`."""
        deadline = time.monotonic() + self.timeout_s
        pending = dict(keys_by_rank)
        values: dict[int, Any] = {}
        pause = 0.0005
        while True:
            for rank, key in list(pending.items()):
                if self.store.check([key]):
                    values[rank] = _open(self.secret, key, self.store.get(key))
                    self.store.delete_key(key)
                    del pending[rank]
            if not pending:
                return values
            ended = {r: w.exit_status() for r, w in self.workers.items() if r in pending}
            exited = {r: status for r, status in ended.items() if status is not None}
            if exited:
                named = ", ".join(f"rank {r} ({status})" for r, status in sorted(exited.items()))
                raise DataParallelError(f"{named} exited while rank {self.rank} waited for its {what}")
            if alive is not None and not alive():
                raise DataParallelError(f"rank {self.rank}: the driver is gone while waiting for {what}")
            if not forever and time.monotonic() > deadline:
                named = ", ".join(f"rank {r}" for r in sorted(pending))
                raise DataParallelError(
                    f"{named} did not report its {what} within {self.timeout_s:g} s (trainer_timeout_s); it is "
                    "hung or dead — see its log, then restart the run (--resume continues from the last checkpoint)"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.02)

    def close(self) -> None:
        """Leave the process group; a driver waits for the workers it started (killing them if they
        hang), then releases what it took for them."""
        for worker in self.workers.values():
            worker.finish(30.0)
        while self.on_close:
            self.on_close.pop()()
        if dist.is_initialized():
            dist.destroy_process_group()


def _timeout(timeout_s: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=timeout_s)


def _backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def _init_group(store: dist.Store, rank: int, world_size: int, timeout_s: float, secret: str) -> RankGroup:
    if torch.cuda.is_available():  # each rank on its own GPU: NCCL's collectives run there
        local_rank, gpus = int(os.environ.get("LOCAL_RANK", rank)), torch.cuda.device_count()
        if local_rank >= gpus:
            raise DataParallelError(
                f"rank {rank} needs GPU {local_rank} of its node, which has {gpus}; start at most {gpus} ranks a node"
            )
        torch.cuda.set_device(local_rank)
    dist.init_process_group(
        _backend(),
        store=dist.PrefixStore("pg", store),
        rank=rank,
        world_size=world_size,
        timeout=_timeout(timeout_s),
    )
    return RankGroup(rank, world_size, dist.PrefixStore("agl", store), timeout_s, secret=secret.encode())


WorkerStarter = Callable[[int, dict[str, str]], WorkerHandle]
"""starter(rank, environment) -> the started worker: runs `main()` of this module (`python -m`)
with the environment's variables set."""


def start_group(
    world_size: int, start_worker: WorkerStarter, *, address: str = "127.0.0.1", timeout_s: float = DEFAULT_TIMEOUT_S
) -> RankGroup:
    """Form a group whose rank 0 is this process: host the store at `address` (where the workers
    reach this machine) and start ranks 1..world_size-1 with `start_worker`."""
    if world_size < 2:
        raise ValueError(f"a data-parallel group needs at least 2 ranks, got {world_size}")
    store = dist.TCPStore(address, 0, world_size, is_master=True, timeout=_timeout(timeout_s), wait_for_workers=False)
    secret = secrets.token_hex(32)
    workers: dict[int, WorkerHandle] = {}
    try:
        for rank in range(1, world_size):
            environment = {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "MASTER_ADDR": address,
                "MASTER_PORT": str(store.port),
                "AGL_TRAINER_TIMEOUT_S": str(timeout_s),
                SECRET_ENV: secret,
            }
            workers[rank] = start_worker(rank, environment)
        group = _init_group(store, 0, world_size, timeout_s, secret)
    except BaseException:
        for worker in workers.values():
            worker.finish(0.0)
        raise
    group.workers = workers
    return group


@dataclass
class _LocalProcess:
    """A worker rank in a child process of this one."""

    process: subprocess.Popen[bytes]

    def exit_status(self) -> str | None:
        code = self.process.poll()
        return None if code is None else f"exit code {code}"

    def finish(self, timeout_s: float) -> None:
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _start_local_process(rank: int, environment: dict[str, str]) -> WorkerHandle:
    return _LocalProcess(subprocess.Popen([sys.executable, "-m", WORKER_MODULE], env={**os.environ, **environment}))


def spawn_local_group(world_size: int, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> RankGroup:
    """Start `world_size - 1` worker processes on this machine and form the group, this process rank 0."""
    return start_group(world_size, _start_local_process, timeout_s=timeout_s)


def launched_rank() -> int | None:
    """This process's rank when a launcher (torchrun) started it in a group of several, else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return int(os.environ["RANK"])
    return None


def join_group_from_env(*, timeout_s: float | None = None) -> RankGroup:
    """Join the group a launcher described in the environment (torchrun: RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT); the store is torchrun's agent's when it offers one, else rank 0's."""
    missing = [name for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise DataParallelError(
            f"{', '.join(missing)} not set: start the ranks with torchrun (or let trainer_ranks start them)"
        )
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = timeout_s if timeout_s is not None else float(os.environ.get("AGL_TRAINER_TIMEOUT_S", DEFAULT_TIMEOUT_S))
    hosts_store = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=hosts_store,
        timeout=_timeout(timeout),
    )
    return _init_group(store, rank, world_size, timeout, os.environ.get(SECRET_ENV, ""))


# ---------------------------------------------------------------------------------- the replicas


def _flat_gradients(client: TrainingClient) -> torch.Tensor:
    return torch.cat(
        [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float()
            for p in client.trainable_parameters()
        ]
    )


def _set_flat_gradients(client: TrainingClient, flat: torch.Tensor) -> None:
    offset = 0
    for param in client.trainable_parameters():
        count = param.numel()
        param.grad = flat[offset : offset + count].view_as(param).to(param.dtype).clone()
        offset += count


def _broadcast_trainable(client: TrainingClient) -> None:
    with torch.no_grad():
        for param in client.trainable_parameters():
            dist.broadcast(param.data, src=0)


def _shard(client: TrainingClient, device: torch.device) -> None:
    """Shard `client`'s model over the group with FSDP2 (one unit per transformer block, then the
    rest), move this rank's shard to `device`, and rebuild the optimizer over the sharded LoRA."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    model = client._model
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft's wrapper, or full weights
    blocks = set(getattr(base, "_no_split_modules", None) or ())
    for module in [module for module in model.modules() if type(module).__name__ in blocks]:
        fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # a sum over the ranks, as one process computes it
            module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    model.to(device)
    client._device = device
    client._params = [param for param in model.parameters() if param.requires_grad]
    client._optimizer = client._new_optimizer()


def _whole(tensors: dict[str, Any]) -> dict[str, Any]:
    """`tensors` with every shard gathered whole (a collective: every rank calls it, in the same order)."""
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        return {key: value.full_tensor() if isinstance(value, DTensor) else value for key, value in tensors.items()}


def _whole_optimizer_state(client: TrainingClient) -> dict[str, Any]:
    state = client._optimizer.state_dict()
    return {**state, "state": {index: _whole(entry) for index, entry in state["state"].items()}}


def _apply_whole_state(
    client: TrainingClient, adapter: dict[str, torch.Tensor], optimizer_state: dict[str, Any] | None
) -> None:
    """Load a one-process adapter (and optimizer state) into this rank's shards: each rank cuts its
    own piece from the whole tensors it holds (no communication)."""
    from torch.distributed.tensor import distribute_tensor

    params = client._params
    keys = list(TrainingClient._trained_state(client))  # in the order of the trainable parameters
    if len(keys) != len(params):
        raise DataParallelError(f"{len(keys)} adapter tensors for {len(params)} trained parameters")

    def piece(whole: torch.Tensor, param: Any) -> Any:
        whole = whole.to(device=param.device, dtype=param.dtype)
        return distribute_tensor(whole, param.device_mesh, param.placements, src_data_rank=None)

    with torch.no_grad():
        for key, param in zip(keys, params, strict=True):
            param.copy_(piece(adapter[key], param))
    if optimizer_state is not None:
        state = {
            index: {
                name: piece(value, params[int(index)])
                if isinstance(value, torch.Tensor) and value.shape == params[int(index)].shape
                else value
                for name, value in entry.items()
            }
            for index, entry in optimizer_state["state"].items()
        }
        client._optimizer.load_state_dict({**optimizer_state, "state": state})


def _passes(data: Sequence[Datum], max_batch_tokens: int) -> int:
    """How many micro-batches (forward passes) a client runs for `data`."""
    return len(batch_groups([datum.num_tokens for datum in data], max_batch_tokens)) if data else 0


def _idle_pass(client: TrainingClient, backward: bool, forwards: int) -> None:
    """A pass over one token that adds nothing: it takes part in the collectives of a sharded pass
    (`forwards` all-gathers, and with `backward` the reduce-scatter), for a rank with fewer micro-batches."""
    ids = torch.zeros((1, 1), dtype=torch.long, device=client.device)
    with torch.set_grad_enabled(backward):
        logits = client._model(input_ids=ids, use_cache=False).logits
        for _ in range(forwards - 1):
            with torch.no_grad():
                client._model(input_ids=ids, use_cache=False)
        if backward:
            (logits.float().sum() * 0).backward()


class _CallAbandoned(DataParallelError):
    """A worker's side of a call another rank failed (the driver reports it; the worker goes on)."""


class _Replica:
    """What every rank does for a call, driver and worker alike (one rule, one place).

    It reaches into the client's step internals on purpose: a replica is the client's own layer.
    """

    def __init__(self, client: TrainingClient, group: RankGroup, sharding: Sharding) -> None:
        self.client = client
        self.group = group
        self.sharded = sharding == "fsdp"
        self.communication_s = 0.0
        """Seconds spent meeting the other ranks and summing gradients (waiting for the slowest included)."""

    def scored(
        self,
        data: list[Datum],
        loss_fn: str | None,
        loss_fn_config: dict[str, Any] | None,
        backward: bool = True,
        passes: int = 0,
    ) -> _Share:
        """This rank's share of a forward(_backward) (nothing for an empty share); sharded, padded
        with idle passes to the busiest rank's `passes`."""
        metrics = StepMetrics()
        outputs: list[dict[str, torch.Tensor]] = []
        if data:
            spec, config, tensors = self.client._prepare(data, loss_fn, loss_fn_config)
            metrics, outputs = self.client._accumulate(tensors, spec, config, backward)
        idle = passes - _passes(data, self.client._max_batch_tokens)
        if idle > 0:
            config = resolve_config(get_loss(loss_fn), loss_fn_config) if loss_fn is not None else {}
            # The KL term's reference pass is a collective too, unless it runs on a whole frozen copy.
            forwards = 2 if config.get("kl_coef") and not self.client._full_weights else 1
            for _ in range(idle):
                _idle_pass(self.client, backward, forwards)
        return metrics, outputs

    def reference(self, data: list[Datum], passes: int) -> list[torch.Tensor]:
        """This rank's share of a sharded reference_logprobs, padded like `scored`."""
        logprobs = TrainingClient._reference_impl(self.client, data) if data else []
        with self.client._model.disable_adapter():
            for _ in range(passes - _passes(data, self.client._max_batch_tokens)):
                _idle_pass(self.client, False, 1)
        return logprobs

    def summed(self, call: int, compute: Callable[[], T]) -> T:
        """Run `compute` (which adds this rank's gradients), then sum every rank's new gradients into
        the ones accumulated before it — two calls before an optim_step add up, as on one process.
        Any rank's failure fails the call on every rank and leaves the gradients as they were.
        Sharded, the ranks meet first and the sum is FSDP's reduce-scatter inside `compute`."""
        if self.sharded:
            return self._sharded_sum(call, compute)
        before = _flat_gradients(self.client)
        self.client._optimizer.zero_grad(set_to_none=True)
        try:
            result = compute()
        except Exception as error:
            _set_flat_gradients(self.client, before)
            self.meet(call, "gradients", error)
            if self.group.rank != 0:
                raise _CallAbandoned(f"call {call} failed here: {error!r}") from error
            raise
        began = time.perf_counter()
        try:
            self.meet(call, "gradients")
        except DataParallelError:
            _set_flat_gradients(self.client, before)
            raise
        summed = _flat_gradients(self.client)
        dist.all_reduce(summed)
        _set_flat_gradients(self.client, before + summed)
        self.communication_s += time.perf_counter() - began
        return result

    def together(self, call: int, compute: Callable[[], T]) -> T:
        """Run a sharded call, whose passes are collectives: the ranks meet before the first one."""
        began = time.perf_counter()
        self.meet(call, "first all-gather")
        self.communication_s += time.perf_counter() - began
        try:
            return compute()
        except Exception as error:
            if self.group.rank != 0:
                raise _CallAbandoned(f"call {call} failed here: {error!r}") from error
            raise

    def _sharded_sum(self, call: int, compute: Callable[[], T]) -> T:
        params = self.client._params
        before = [param.grad for param in params]
        for param in params:
            param.grad = None
        try:
            result = self.together(call, compute)
        except Exception:
            for param, grad in zip(params, before, strict=True):
                param.grad = grad
            raise
        for param, grad in zip(params, before, strict=True):
            if grad is not None:
                param.grad = grad if param.grad is None else grad + param.grad
        return result

    def meet(self, call: int, what: str, error: BaseException | None = None) -> None:
        """Wait until every rank is at call `call` and ready (named timeout), so the collective after
        it cannot hang; a rank's `error` fails the call on every rank."""
        group = self.group
        if group.rank != 0:
            group.post(f"at/{call}/{group.rank}", None if error is None else _failed(error))
            if not group.take(f"go/{call}") and error is None:
                raise _CallAbandoned(f"call {call} failed on another rank")
            return
        answers = group.take_all(
            group.worker_keys(f"at/{call}"), what=f"arrival at the {what} all-reduce of call {call}"
        )
        failed = {rank: _failure(answer) for rank, answer in sorted(answers.items()) if _failure(answer)}
        group.post(f"go/{call}", error is None and not failed)
        if failed and error is None:
            rank, reason = next(iter(failed.items()))
            raise DataParallelError(f"rank {rank} failed its share of call {call}: {reason}")


class DataParallelTrainingClient(TrainingClient):
    """A `TrainingClient` on rank 0 of a data-parallel group: the same API and results, each
    `forward_backward` shared among the ranks by tokens (see the module docs).

    group: from `spawn_local_group` or `join_group_from_env`. sharding: "replicate" (a whole model
    on every rank) or "fsdp" (FSDP2 shards). config_digest: what each worker's run config must hash
    to (torchrun starts every rank from its own copy); None skips the check. Every other argument is
    `TrainingClient`'s; the workers build their replica from the same ones.
    """

    def __init__(
        self,
        group: RankGroup,
        *,
        sharding: Sharding = "replicate",
        config_digest: str | None = None,
        **client_args: Any,
    ) -> None:
        if group.rank != 0:
            raise ValueError(f"the driver is rank 0; rank {group.rank} runs serve_worker")
        if sharding not in get_args(Sharding):
            raise ValueError(f"sharding must be one of {', '.join(get_args(Sharding))}, got {sharding!r}")
        self._group = group
        self._calls = 0
        group.post("client", {"args": {k: v for k, v in client_args.items() if k != "sampler"}, "sharding": sharding})
        try:
            super().__init__(**_built_on(client_args, sharding))
            self._replica = _Replica(self, group, sharding)
            self._check_workers(config_digest)
            self._run(self._start_every_rank, _device_of(client_args))
        except BaseException:
            self._tell(self._next_call(), _STOP)
            if hasattr(self, "_executor"):
                TrainingClient.close(self)
            group.close()
            raise

    @property
    def group(self) -> RankGroup:
        """The data-parallel group this client drives."""
        return self._group

    def _check_workers(self, config_digest: str | None) -> None:
        mine = replace(self.identity, base_model="")  # the same files may sit at another path on another node
        for rank, hello in sorted(
            self._group.take_all(self._group.worker_keys("hello"), what="model replica (hello)").items()
        ):
            if _failure(hello):
                raise DataParallelError(f"rank {rank} could not build its replica: {_failure(hello)}")
            if replace(ModelIdentity(**hello["identity"]), base_model="") != mine:
                raise DataParallelError(
                    f"rank {rank} built a different model or LoRA ({hello['identity']}) from rank 0's "
                    f"({self.identity}); every rank must see the same model files"
                )
            if config_digest is not None and hello["config_digest"] not in (None, config_digest):
                raise DataParallelError(
                    f"rank {rank}'s run config differs from rank 0's (digest {hello['config_digest']} vs "
                    f"{config_digest}); give every rank the same config file"
                )

    def _next_call(self) -> int:
        self._calls += 1
        return self._calls

    def _tell(self, call: int, op: str, per_rank: Callable[[int], tuple[Any, ...]] | tuple[Any, ...] = ()) -> None:
        for rank in range(1, self._group.world_size):
            args = per_rank(rank) if callable(per_rank) else per_rank
            self._group.post(f"call/{call}/{rank}", (op, args))

    def _await_workers(self, call: int, what: str) -> dict[int, Any]:
        """Each worker's answer to call `call`; DataParallelError naming a rank that failed it (its
        answer is then the error's text)."""
        answers = self._group.take_all(self._group.worker_keys(f"done/{call}"), what=what)
        for rank, answer in sorted(answers.items()):
            if _failure(answer):
                raise DataParallelError(f"rank {rank} failed {what}: {_failure(answer)}")
        return answers

    def _start_every_rank(self, device: torch.device) -> None:
        """Replicas start from rank 0's LoRA; shards are cut, every rank at once."""
        call = self._next_call()
        self._tell(call, "start")
        _start(self._replica, call, device)

    def _shares(self, data: Sequence[Datum]) -> tuple[list[list[int]], int]:
        """Each rank's datum indices and, sharded, the micro-batches every rank runs (the busiest's)."""
        shards = shard_by_tokens([datum.num_tokens for datum in data], self._group.world_size)
        if not self._replica.sharded:
            return shards, 0
        return shards, max(_passes([data[i] for i in shard], self._max_batch_tokens) for shard in shards)

    def _forward_impl(
        self, data: Sequence[Datum], loss_fn: str | None, loss_fn_config: dict[str, Any] | None, backward: bool
    ) -> ForwardBackwardOutput:
        if not backward and not self._replica.sharded:
            return super()._forward_impl(data, loss_fn, loss_fn_config, backward)
        start = time.perf_counter()
        self._prepare(data, loss_fn, loss_fn_config)  # a bad call is refused here, before any rank starts it
        shards, passes = self._shares(data)
        call = self._next_call()
        self._tell(
            call,
            "forward_backward",
            lambda rank: ([_datum_state(data[i]) for i in shards[rank]], loss_fn, loss_fn_config, backward, passes),
        )
        own = [data[i] for i in shards[0]]
        replica = self._replica
        replica.communication_s = 0.0
        share = lambda: replica.scored(own, loss_fn, loss_fn_config, backward, passes)  # noqa: E731
        metrics, own_outputs = replica.summed(call, share) if backward else replica.together(call, share)
        shares = {0: own_outputs}
        began = time.perf_counter()
        for rank, (rank_metrics, rank_outputs) in sorted(self._await_workers(call, "forward_backward").items()):
            metrics.merge(StepMetrics.from_state(rank_metrics))
            shares[rank] = rank_outputs
        communication_s = replica.communication_s + time.perf_counter() - began
        timing = {"time_s": time.perf_counter() - start, COMMUNICATION_KEY: communication_s}
        return ForwardBackwardOutput(_in_datum_order(shares, shards, len(data)), metrics.result(timing))

    def _reference_impl(self, data: Sequence[Datum]) -> list[torch.Tensor]:
        if not self._replica.sharded or self._full_weights:  # a frozen whole copy: rank 0 alone
            return super()._reference_impl(data)
        self._validate(data, required=(TARGET_TOKENS,), allow_unknown=True)
        shards, passes = self._shares(data)
        call = self._next_call()
        self._tell(call, "reference", lambda rank: ([_datum_state(data[i]) for i in shards[rank]], passes))
        own = [data[i] for i in shards[0]]
        shares = {0: self._replica.together(call, lambda: self._replica.reference(own, passes))}
        shares.update(self._await_workers(call, "reference_logprobs"))
        return _in_datum_order(shares, shards, len(data))

    def _custom_impl(self, data: Sequence[Datum], fn: CustomLossFn) -> ForwardBackwardOutput:
        if self._replica.sharded:
            raise ValueError(
                "forward_backward_custom needs the whole model on one rank (a custom loss may couple its "
                "datums, as DPO pairs them); with sharding='fsdp' use a built-in loss, or train this run "
                "with sharding='replicate'"
            )
        # A custom loss may couple its datums (DPO pairs them), so the driver computes all of it and
        # the workers add zero gradients: exact, not faster.
        call = self._next_call()
        self._tell(call, "forward_backward", ([], None, None, True, 0))
        output = self._replica.summed(call, lambda: TrainingClient._custom_impl(self, data, fn))
        self._await_workers(call, "forward_backward_custom")
        return output

    def _optim_impl(self, params: AdamParams) -> OptimStepOutput:
        if not isinstance(params, AdamParams):
            raise TypeError(f"optim_step takes AdamParams, got {type(params).__name__}")
        params.validate()  # refused here, before any rank steps
        call = self._next_call()
        self._tell(call, "optim_step", (dataclasses.asdict(params),))
        try:
            output = super()._optim_impl(params)
        except Exception:
            # Every rank failed the same way (the same gradients): take their answers, raise ours.
            self._group.take_all(self._group.worker_keys(f"done/{call}"), what="optim_step")
            raise
        mine = _weights_digest(self._replica)
        for rank, digest in sorted(self._await_workers(call, "optim_step").items()):
            if digest != mine:
                raise DataParallelError(
                    f"rank {rank}'s weights differ from rank 0's after step {self._step}: the replicas "
                    "diverged (a rank with another torch build or device kind?); restart from the last checkpoint"
                )
        return output

    def zero_grad(self) -> None:
        """Discard the accumulated gradients on every rank."""
        self._run(self._zero_every_rank)

    def _zero_every_rank(self) -> None:
        self._tell(self._next_call(), "zero_grad")
        self._optimizer.zero_grad(set_to_none=True)

    def _trained_state(self) -> dict[str, torch.Tensor]:
        if not self._replica.sharded:
            return super()._trained_state()
        call = self._next_call()
        self._tell(call, "gather", ("adapter",))
        return _gathered(self._replica, call, "adapter")

    def _optimizer_state(self) -> dict[str, Any]:
        if not self._replica.sharded:
            return super()._optimizer_state()
        call = self._next_call()
        self._tell(call, "gather", ("optimizer",))
        return _gathered(self._replica, call, "optimizer")

    def _apply_state(self, adapter: dict[str, torch.Tensor], optimizer_state: dict[str, Any] | None, step: int) -> None:
        # Every rank loads the same tensors: a replica the whole of them, a shard its piece.
        self._tell(self._next_call(), "apply_state", (_on_cpu(adapter), _on_cpu(optimizer_state), step))
        _load_here(self._replica, adapter, optimizer_state, step)

    def close(self) -> None:
        """Finish queued calls, stop the workers, leave the group; then as `TrainingClient.close`."""
        if not self._closed:
            self._run(lambda: self._tell(self._next_call(), _STOP))
        super().close()
        self._group.close()


def _device_of(client_args: dict[str, Any]) -> torch.device:
    """Where a rank's model lives: the client's `device`, else this process's CUDA device if any."""
    device = client_args.get("device")
    if device is None and torch.cuda.is_available():
        return torch.device(f"cuda:{torch.cuda.current_device()}")
    return torch.device(device or "cpu")


def _built_on(client_args: dict[str, Any], sharding: Sharding) -> dict[str, Any]:
    """A sharded rank builds its model on the CPU and moves only its shard to the device."""
    return {**client_args, "device": "cpu" if sharding == "fsdp" else _device_of(client_args)}


def _in_datum_order(shares: dict[int, list[T]], shards: list[list[int]], count: int) -> list[T]:
    ordered: list[Any] = [None] * count
    for rank, outputs in shares.items():
        for index, output in zip(shards[rank], outputs, strict=True):
            ordered[index] = output
    return ordered


def _on_cpu(value: Any) -> Any:
    """`value` with every tensor in it copied to the CPU (what travels between ranks)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu")
    if isinstance(value, dict):
        return {key: _on_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(item) for item in value)
    return value


def _weights_digest(replica: _Replica) -> str | None:
    """sha256 of the trained parameters' bytes: replicas that stepped alike have equal digests.
    None for a shard (each rank holds another piece)."""
    if replica.sharded:
        return None
    digest = hashlib.sha256()
    for param in replica.client.trainable_parameters():
        digest.update(param.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _start(replica: _Replica, call: int, device: torch.device) -> None:
    replica.meet(call, "start")
    if replica.sharded:
        _shard(replica.client, device)
    else:
        _broadcast_trainable(replica.client)


def _gathered(replica: _Replica, call: int, what: str) -> dict[str, Any]:
    replica.meet(call, f"gather of the {what}")
    client = replica.client
    return _whole(TrainingClient._trained_state(client)) if what == "adapter" else _whole_optimizer_state(client)


def _load_here(
    replica: _Replica, adapter: dict[str, torch.Tensor], optimizer_state: dict[str, Any] | None, step: int
) -> None:
    """Load checkpoint tensors into this rank: a replica takes them whole, a shard its piece."""
    client = replica.client
    if replica.sharded:
        _apply_whole_state(client, adapter, optimizer_state)
        client._step = step
    else:
        TrainingClient._apply_state(client, adapter, optimizer_state, step)


def serve_worker(group: RankGroup, *, config_digest: str | None = None) -> None:
    """Run a worker rank until the driver stops it: build the replica the driver describes, then
    execute its calls in order (see the module docs)."""
    driver_alive = _driver_watch()
    described = group.take("client", forever=True, alive=driver_alive)
    client_args, sharding = described["args"], described["sharding"]
    try:
        client = TrainingClient(**_built_on(client_args, sharding))
    except Exception as error:
        group.post(f"hello/{group.rank}", _failed(error))  # the driver names this rank and stops
        raise
    identity = dataclasses.asdict(client.identity)
    group.post(f"hello/{group.rank}", {"identity": identity, "config_digest": config_digest})
    replica = _Replica(client, group, sharding)
    device = _device_of(client_args)
    call = 0
    try:
        while True:
            call += 1
            op, args = group.take(f"call/{call}/{group.rank}", forever=True, alive=driver_alive)
            if op == _STOP:
                return
            _serve_call(replica, call, op, args, device)
    finally:
        client.close()


def _serve_call(replica: _Replica, call: int, op: str, args: tuple[Any, ...], device: torch.device) -> None:
    client, group = replica.client, replica.group
    done = f"done/{call}/{group.rank}"
    try:
        if op == "start":
            _start(replica, call, device)
        elif op == "forward_backward":
            states, loss_fn, loss_fn_config, backward, passes = args
            data = [Datum(**state) for state in states]
            share = lambda: replica.scored(data, loss_fn, loss_fn_config, backward, passes)  # noqa: E731
            metrics, outputs = replica.summed(call, share) if backward else replica.together(call, share)
            group.post(done, (metrics.state(), outputs))
        elif op == "reference":
            states, passes = args
            data = [Datum(**state) for state in states]
            group.post(done, replica.together(call, lambda: replica.reference(data, passes)))
        elif op == "optim_step":
            try:
                client._optim_impl(AdamParams(**args[0]))
            except Exception as error:  # the driver's step fails the same way (the same gradients)
                group.post(done, _failed(error))
                return
            group.post(done, _weights_digest(replica))
        elif op == "zero_grad":
            client._optimizer.zero_grad(set_to_none=True)
        elif op == "gather":
            _gathered(replica, call, args[0])
        elif op == "apply_state":
            _load_here(replica, *args)
        else:
            raise DataParallelError(f"unknown call {op!r} from the driver")
    except _CallAbandoned as abandoned:  # the driver reports it; the next call may succeed
        print(f"[agl_bridge rank {group.rank}] {abandoned}", file=sys.stderr)


def _driver_watch() -> Callable[[], bool]:
    """A check that the process that started this one is still there (a local driver's workers
    must not outlive it; under torchrun the agent stops the ranks)."""
    parent = os.getppid()
    return lambda: os.getppid() == parent


def main() -> None:
    """A worker rank started by `start_group` (a local process, a Ray task): join, serve, leave."""
    group = join_group_from_env()
    try:
        serve_worker(group)
    finally:
        group.close()


if __name__ == "__main__":
    main()
