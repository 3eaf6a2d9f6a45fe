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
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
import torch.distributed as dist

from agl_bridge.primitives.checkpoint import ModelIdentity
from agl_bridge.primitives.client import (
    AdamParams,
    CustomLossFn,
    ForwardBackwardOutput,
    OptimStepOutput,
    TrainingClient,
)
from agl_bridge.primitives.datum import Datum
from agl_bridge.primitives.metrics import StepMetrics

T = TypeVar("T")

_Share = tuple[StepMetrics, list[dict[str, "torch.Tensor"]]]

DEFAULT_TIMEOUT_S = 600.0
"""How long a rank waits for another before naming it (model loading on a worker counts too)."""

WORKER_MODULE = "agl_bridge.primitives.data_parallel"
"""What `spawn_local_group` runs in each worker process (`python -m`)."""

_STOP = "stop"

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


def _weights_digest(client: TrainingClient) -> str:
    """sha256 of the trained parameters' bytes: replicas that stepped alike have equal digests."""
    digest = hashlib.sha256()
    for param in client.trainable_parameters():
        digest.update(param.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _broadcast_trainable(client: TrainingClient) -> None:
    with torch.no_grad():
        for param in client.trainable_parameters():
            dist.broadcast(param.data, src=0)


class _CallAbandoned(DataParallelError):
    """A worker's side of a call another rank failed (the driver reports it; the worker goes on)."""


class _Replica:
    """What every rank does for a call, driver and worker alike (one rule, one place).

    It reaches into the client's step internals on purpose: a replica is the client's own layer.
    """

    def __init__(self, client: TrainingClient, group: RankGroup) -> None:
        self.client = client
        self.group = group
        self.communication_s = 0.0
        """Seconds spent meeting the other ranks and summing gradients (waiting for the slowest included)."""

    def scored(self, data: list[Datum], loss_fn: str | None, loss_fn_config: dict[str, Any] | None) -> _Share:
        """This rank's share of a forward_backward, with gradients (nothing for an empty share)."""
        if not data:
            return StepMetrics(), []
        spec, config, tensors = self.client._prepare(data, loss_fn, loss_fn_config)
        return self.client._accumulate(tensors, spec, config, True)

    def summed(self, call: int, compute: Callable[[], T]) -> T:
        """Run `compute` (which adds this rank's gradients), then sum every rank's new gradients into
        the ones accumulated before it — two calls before an optim_step add up, as on one process.
        Any rank's failure fails the call on every rank and leaves the gradients as they were."""
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

    group: from `spawn_local_group` or `join_group_from_env`. config_digest: what each worker's run
    config must hash to (torchrun starts every rank from its own copy); None skips the check.
    Every other argument is `TrainingClient`'s; the workers build their replica from the same ones.
    """

    def __init__(self, group: RankGroup, *, config_digest: str | None = None, **client_args: Any) -> None:
        if group.rank != 0:
            raise ValueError(f"the driver is rank 0; rank {group.rank} runs serve_worker")
        self._group = group
        self._calls = 0
        group.post("client", {key: value for key, value in client_args.items() if key != "sampler"})
        try:
            super().__init__(**client_args)
            self._replica = _Replica(self, group)
            self._check_workers(config_digest)
            self._run(self._broadcast_weights)
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

    def _broadcast_weights(self) -> None:
        call = self._next_call()
        self._tell(call, "broadcast")
        self._replica.meet(call, "weights")
        _broadcast_trainable(self)

    def _forward_impl(
        self, data: Sequence[Datum], loss_fn: str | None, loss_fn_config: dict[str, Any] | None, backward: bool
    ) -> ForwardBackwardOutput:
        if not backward:
            return super()._forward_impl(data, loss_fn, loss_fn_config, backward)
        start = time.perf_counter()
        self._prepare(data, loss_fn, loss_fn_config)  # a bad call is refused here, before any rank starts it
        shards = shard_by_tokens([datum.num_tokens for datum in data], self._group.world_size)
        call = self._next_call()
        self._tell(
            call,
            "forward_backward",
            lambda rank: ([_datum_state(data[i]) for i in shards[rank]], loss_fn, loss_fn_config),
        )
        own = [data[i] for i in shards[0]]
        self._replica.communication_s = 0.0
        metrics, own_outputs = self._replica.summed(call, lambda: self._replica.scored(own, loss_fn, loss_fn_config))
        shares = {0: own_outputs}
        began = time.perf_counter()
        for rank, (rank_metrics, rank_outputs) in sorted(self._await_workers(call, "forward_backward").items()):
            metrics.merge(StepMetrics.from_state(rank_metrics))
            shares[rank] = rank_outputs
        communication_s = self._replica.communication_s + time.perf_counter() - began
        outputs: list[dict[str, torch.Tensor]] = [{} for _ in data]
        for rank, rank_outputs in shares.items():
            for index, output in zip(shards[rank], rank_outputs, strict=True):
                outputs[index] = output
        timing = {"time_s": time.perf_counter() - start, COMMUNICATION_KEY: communication_s}
        return ForwardBackwardOutput(outputs, metrics.result(timing))

    def _custom_impl(self, data: Sequence[Datum], fn: CustomLossFn) -> ForwardBackwardOutput:
        # A custom loss may couple its datums (DPO pairs them), so the driver computes all of it and
        # the workers add zero gradients: exact, not faster.
        call = self._next_call()
        self._tell(call, "forward_backward", ([], None, None))
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
            # Every replica failed the same way (identical gradients): take their answers, raise ours.
            self._group.take_all(self._group.worker_keys(f"done/{call}"), what="optim_step")
            raise
        mine = _weights_digest(self)
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

    def _load_state_impl(self, path: Path, optimizer: bool) -> int:
        step = super()._load_state_impl(path, optimizer)
        self._broadcast_weights()
        self._tell(self._next_call(), "optimizer_state", (self._optimizer.state_dict(), self._step))
        return step

    def close(self) -> None:
        """Finish queued calls, stop the workers, leave the group; then as `TrainingClient.close`."""
        if not self._closed:
            self._run(lambda: self._tell(self._next_call(), _STOP))
        super().close()
        self._group.close()


def serve_worker(group: RankGroup, *, config_digest: str | None = None) -> None:
    """Run a worker rank until the driver stops it: build the replica the driver describes, then
    execute its calls in order (see the module docs)."""
    driver_alive = _driver_watch()
    client_args = group.take("client", forever=True, alive=driver_alive)
    if client_args.get("device") is None and torch.cuda.is_available():
        client_args["device"] = f"cuda:{torch.cuda.current_device()}"
    try:
        client = TrainingClient(**client_args)
    except Exception as error:
        group.post(f"hello/{group.rank}", _failed(error))  # the driver names this rank and stops
        raise
    identity = dataclasses.asdict(client.identity)
    group.post(f"hello/{group.rank}", {"identity": identity, "config_digest": config_digest})
    replica = _Replica(client, group)
    call = 0
    try:
        while True:
            call += 1
            op, args = group.take(f"call/{call}/{group.rank}", forever=True, alive=driver_alive)
            if op == _STOP:
                return
            _serve_call(replica, call, op, args)
    finally:
        client.close()


def _serve_call(replica: _Replica, call: int, op: str, args: tuple[Any, ...]) -> None:
    client, group = replica.client, replica.group
    done = f"done/{call}/{group.rank}"
    if op == "broadcast":
        replica.meet(call, "weights")
        _broadcast_trainable(client)
    elif op == "forward_backward":
        states, loss_fn, loss_fn_config = args
        data = [Datum(**state) for state in states]
        try:
            metrics, outputs = replica.summed(call, lambda: replica.scored(data, loss_fn, loss_fn_config))
        except _CallAbandoned as abandoned:  # the driver reports it; the next call may succeed
            print(f"[agl_bridge rank {group.rank}] {abandoned}", file=sys.stderr)
            return
        group.post(done, (metrics.state(), outputs))
    elif op == "optim_step":
        try:
            client._optim_impl(AdamParams(**args[0]))
        except Exception as error:  # the driver's step fails the same way (identical gradients)
            group.post(done, _failed(error))
            return
        group.post(done, _weights_digest(client))
    elif op == "zero_grad":
        client._optimizer.zero_grad(set_to_none=True)
    elif op == "optimizer_state":
        state, step = args
        client._optimizer.load_state_dict(state)
        client._step = step
    else:
        raise DataParallelError(f"unknown call {op!r} from the driver")


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
