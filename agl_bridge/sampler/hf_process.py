"""`HFProcessSampler`: the HF sampler in a child process of its own, off the caller's interpreter lock.

In one process, the proxy's event loop and `HFSampler`'s worker thread share Python's interpreter
lock. A small model's forward pass is hundreds of short Python stretches between torch operations,
each of which lets go of the lock; whenever the loop has work (a burst of requests to parse, encode,
record and answer) it takes the lock at the next release and the worker waits for the whole burst.
Profiled on 2 cores with 16 clients of the tiny model: requests waited ~18 ms on average to join the
batch, in bursts, while the loop served their neighbours, and every running sequence waited with
them. In a process of its own the sampler decodes while the proxy serves HTTP.

The contract is `HFSampler`'s, unchanged: exact ids and raw logprobs, continuous batching, streaming
token events, live weight swaps between decode steps (tensors are copied to the child; each token
records the policy version that produced it), scoring, cancellation (a cancelled request's rows leave
the batch at the child's next step), and the same refusals, raised here before anything is sent
(`checked_prompt`). Errors the child meets come back as the same exception types. The wire and the
child are in `hf_wire.py` and `hf_child.py`. If the child dies, every request in flight fails with
`SamplerProcessError` and so do later ones; `close` stops it (it also stops when this process does).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from agl_bridge.sampler.base import SampleResult, SamplingParams, TokenEvent
from agl_bridge.sampler.hf import SamplerClosedError, checked_prompt, settle_future
from agl_bridge.sampler.hf_child import CHILD_COMMAND
from agl_bridge.sampler.hf_wire import (
    CALL,
    CANCEL,
    CLOSE,
    CLOSED,
    DONE,
    FAILED,
    OPTIONS,
    RAISED,
    READY,
    RETURNED,
    SAMPLE,
    START_FAILED,
    TOKEN,
    ChildOptions,
    Message,
    SamplerInfo,
    decode_error,
    decode_info,
    decode_result,
    encode_options,
    encode_params,
    read_frame,
    tensor_frame,
    write_frame,
)

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
"""The folder `agl_bridge` is imported from here, put first on the child's path so it runs the same code."""


class SamplerProcessError(RuntimeError):
    """The sampler's process exited or stopped answering; its stderr (inherited) says why."""


@dataclass
class _Waiting:
    """A sample request sent to the child: its future and, for a streamed one, where its token events go."""

    future: concurrent.futures.Future[SampleResult]
    on_tokens: Callable[[list[TokenEvent]], object] | None


class HFProcessSampler:
    """A `TokenSampler` that runs `HFSampler` over `model` (`tiny`, a local path or a hub id) in a child process.

    The keyword arguments are `HFSampler`'s (and `load_causal_lm`'s device and dtype); `torch_threads`
    sets the child's torch intra-op threads (default: torch's own). Blocks until the model is loaded;
    a model that cannot be loaded or served raises the child's error (OSError, UnsupportedArchitectureError, ...).
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        device: str = "cpu",
        dtype: torch.dtype | str | None = None,
        max_batch_size: int = 64,
        max_prefill_tokens: int = 16384,
        max_context: int | None = None,
        seed: int | None = None,
        torch_threads: int | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        dtype_name = str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else dtype
        options = ChildOptions(
            str(model), device, dtype_name, max_batch_size, max_prefill_tokens, max_context, seed, torch_threads
        )
        self._lock = threading.Lock()  # sending, and the tables of what is waiting
        self._ids = itertools.count()
        self._waiting: dict[int, _Waiting] = {}
        self._calls: dict[int, concurrent.futures.Future[Any]] = {}
        self._closing = False
        self._death: str | None = None
        self._process, self._connection = _start_child()
        try:
            write_frame(self._connection, [[OPTIONS, encode_options(options)]])
            self._info = self._await_ready(str(model))
        except BaseException:  # a start that failed, or was interrupted (Ctrl-C while the model loads)
            self._connection.close()
            self._process.kill()
            self._process.wait()
            raise
        self._policy_version = self._info.policy_version
        self._reader = threading.Thread(target=self._read, name="agl-hf-process-reader", daemon=True)
        self._reader.start()

    # ----------------------------------------------------------------- what HFSampler offers

    @property
    def policy_version(self) -> int:
        """The version of the weights new tokens are sampled with."""
        return self._policy_version

    @property
    def max_context(self) -> int:
        """Most tokens (prompt + sampled) one sequence may have."""
        return self._info.max_context

    @property
    def vocab_size(self) -> int:
        """Size of the model's output vocabulary."""
        return self._info.vocab_size

    @property
    def max_batch_size(self) -> int:
        """Most sequences decoded together (a request with n samples takes n)."""
        return self._info.max_batch_size

    @property
    def model_config(self) -> dict[str, Any]:
        """The served model's transformers config as a dict (`to_dict()` of the one loaded in the child)."""
        return self._info.model_config

    @property
    def embeddings_tied(self) -> bool:
        """Whether the served model's output layer shares its input embeddings' weight."""
        return self._info.embeddings_tied

    @property
    def running_sequences(self) -> int:
        """How many sequences the child is sampling now: a gauge for monitoring (one round trip)."""
        return int(self._call("running_sequences").result())

    def submit(
        self,
        prompt_tokens: Sequence[int],
        params: SamplingParams,
        num_samples: int = 1,
        *,
        on_token: Callable[[TokenEvent], object] | None = None,
    ) -> concurrent.futures.Future[SampleResult]:
        """Send a sample request and return a future; cancelling it frees its batch slots in the child.

        `on_token`, if given, is called from this sampler's reader thread for every token as it
        arrives; keep it cheap (hand the event to another thread or loop).
        """

        def each(events: list[TokenEvent]) -> None:
            assert on_token is not None
            for event in events:
                on_token(event)

        return self._submit(prompt_tokens, params, num_samples, None if on_token is None else each)

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
        """Yield a TokenEvent per token as it is sampled, then the SampleResult; leaving early cancels.

        The tokens one frame from the child brings wake the event loop once, not once per token.
        """
        loop = asyncio.get_running_loop()
        batches: asyncio.Queue[list[TokenEvent] | None] = asyncio.Queue()
        future = self._submit(
            prompt_tokens,
            params,
            num_samples,
            lambda events: loop.call_soon_threadsafe(batches.put_nowait, events),
        )
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(batches.put_nowait, None))
        try:
            while (events := await batches.get()) is not None:
                for event in events:
                    yield event
            yield future.result()
        finally:
            future.cancel()

    def compute_logprobs(self, token_ids: Sequence[int]) -> list[float | None]:
        """Raw logprob of each token given the tokens before it; the first entry is None."""
        return list(self._call("compute_logprobs", list(token_ids)).result())

    async def compute_logprobs_async(self, token_ids: Sequence[int]) -> list[float | None]:
        """Async form of `compute_logprobs`."""
        return list(await asyncio.wrap_future(self._call("compute_logprobs", list(token_ids))))

    def compute_top_logprobs(self, token_ids: Sequence[int], k: int, start: int) -> list[list[tuple[int, float]]]:
        """For each position from `start` on, the k most likely tokens there and their raw logprobs
        (with the weights current at call time)."""
        return _ranked(self._call("compute_top_logprobs", list(token_ids), k, start).result())

    async def compute_top_logprobs_async(
        self, token_ids: Sequence[int], k: int, start: int
    ) -> list[list[tuple[int, float]]]:
        """Async form of `compute_top_logprobs`."""
        return _ranked(await asyncio.wrap_future(self._call("compute_top_logprobs", list(token_ids), k, start)))

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> int:
        """Copy full weights in between decode steps; returns the new policy version."""
        return self._swap(self._call("load_weights", state_dict, version))

    def load_lora(self, state_dict: Mapping[str, torch.Tensor], scaling: float, version: int | None = None) -> int:
        """Merge a peft LoRA adapter (replacing the previous one) between decode steps; returns the new version."""
        return self._swap(self._call("load_lora", state_dict, scaling, version))

    def close(self) -> None:
        """Stop the child; requests still running fail with SamplerClosedError."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            if self._death is None:
                try:
                    write_frame(self._connection, [[CLOSE]])
                except OSError:
                    pass
        if threading.current_thread() is not self._reader:
            self._reader.join(timeout=60)
        self._stop_process()

    def __enter__(self) -> HFProcessSampler:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ----------------------------------------------------------------- sending

    def _submit(
        self,
        prompt_tokens: Sequence[int],
        params: SamplingParams,
        num_samples: int,
        on_tokens: Callable[[list[TokenEvent]], object] | None,
    ) -> concurrent.futures.Future[SampleResult]:
        prompt = checked_prompt(
            prompt_tokens,
            params,
            num_samples,
            vocab_size=self.vocab_size,
            max_context=self.max_context,
            max_batch_size=self.max_batch_size,
        )
        future: concurrent.futures.Future[SampleResult] = concurrent.futures.Future()
        with self._lock:
            rid = next(self._ids)
            self._send_locked([SAMPLE, rid, prompt, encode_params(params), num_samples, on_tokens is not None])
            self._waiting[rid] = _Waiting(future, on_tokens)
        future.add_done_callback(lambda done: self._cancel_if_cancelled(rid, done))
        return future

    def _cancel_if_cancelled(self, rid: int, future: concurrent.futures.Future[SampleResult]) -> None:
        if future.cancelled():
            self._forget(rid)

    def _forget(self, rid: int) -> None:
        """Stop waiting for request `rid` and tell the child to drop its rows."""
        with self._lock:
            if self._waiting.pop(rid, None) is not None and self._death is None and not self._closing:
                try:
                    write_frame(self._connection, [[CANCEL, rid]])
                except OSError:
                    pass  # the reader notices the child is gone

    def _call(self, name: str, *args: Any) -> concurrent.futures.Future[Any]:
        """Ask the child to run `name`; a state dict among `args` travels as a tensor frame of its own.

        The frame's names go along in the caller's order, which safetensors does not keep: where two
        names share one weight (tied embeddings) the last one copied wins, as in `HFSampler`.
        """
        frames = [tensor_frame(arg) for arg in args if isinstance(arg, Mapping)]
        wired, index = [], 0
        for arg in args:
            if isinstance(arg, Mapping):
                wired.append({"tensors": index, "names": list(arg)})
                index += 1
            else:
                wired.append(arg)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            cid = next(self._ids)
            self._send_locked([CALL, cid, name, wired, len(frames)], frames)
            self._calls[cid] = future
        return future

    def _send_locked(self, message: Message, tensor_frames: Sequence[bytes] = ()) -> None:
        if self._closing:
            raise SamplerClosedError("the sampler is closed; create a new one")
        if self._death is not None:
            raise SamplerProcessError(self._death)
        try:
            write_frame(self._connection, [message], tensor_frames)
        except OSError as error:
            raise SamplerProcessError(f"cannot reach the sampler process: {error}") from None

    def _swap(self, call: concurrent.futures.Future[Any]) -> int:
        version = int(call.result())
        self._policy_version = version
        return version

    # ----------------------------------------------------------------- receiving

    def _await_ready(self, model: str) -> SamplerInfo:
        try:
            (message,) = read_frame(self._connection)
        except (EOFError, OSError):
            code = self._process.wait()
            raise SamplerProcessError(
                f"the sampler process exited (code {code}) while loading {model!r}; its error is above"
            ) from None
        if message[0] == START_FAILED:
            raise decode_error(message[1])
        if message[0] != READY:
            raise SamplerProcessError(f"the sampler process answered {message[0]!r} instead of {READY!r}")
        return decode_info(message[1])

    def _read(self) -> None:
        """Settle futures from the child's frames until it closes or dies."""
        try:
            while True:
                if not self._dispatch(read_frame(self._connection)):
                    break
        except (EOFError, OSError):
            pass
        with self._lock:
            if not self._closing:
                code = self._process.poll()
                self._death = (
                    f"the sampler process exited unexpectedly (code {code}); its error is above. "
                    "Restart the server or training run"
                )
            waiting, calls = list(self._waiting.values()), list(self._calls.values())
            self._waiting.clear()
            self._calls.clear()
        error: Exception = SamplerClosedError("the sampler was closed")
        if self._death is not None:
            error = SamplerProcessError(self._death)
        for future in [w.future for w in waiting] + calls:
            settle_future(future, error=error)

    def _dispatch(self, messages: list[Message]) -> bool:
        """Hand out one frame: each request's token events together, before its result. False after CLOSED."""
        tokens: dict[int, list[TokenEvent]] = {}
        for message in messages:
            kind = message[0]
            if kind == TOKEN:
                tokens.setdefault(message[1], []).append(TokenEvent(*message[2:6]))
            elif kind in (DONE, FAILED):
                self._deliver(message[1], tokens.pop(message[1], []))
                with self._lock:
                    waiting = self._waiting.pop(message[1], None)
                if waiting is not None:
                    if kind == DONE:
                        settle_future(waiting.future, decode_result(message[2]))
                    else:
                        settle_future(waiting.future, error=decode_error(message[2]))
            elif kind in (RETURNED, RAISED):
                with self._lock:
                    call = self._calls.pop(message[1], None)
                if call is not None:
                    if kind == RETURNED:
                        settle_future(call, message[2])
                    else:
                        settle_future(call, error=decode_error(message[2]))
            elif kind == CLOSED:
                return False
        for rid, events in tokens.items():
            self._deliver(rid, events)
        return True

    def _deliver(self, rid: int, events: list[TokenEvent]) -> None:
        if not events:
            return
        with self._lock:
            waiting = self._waiting.get(rid)
        if waiting is None or waiting.on_tokens is None or waiting.future.done():
            return
        try:
            waiting.on_tokens(events)
        except Exception as error:  # e.g. the listener's event loop closed: only this request fails
            settle_future(waiting.future, error=error)
            self._forget(rid)

    def _stop_process(self) -> None:
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._connection.close()


def _start_child() -> tuple[subprocess.Popen[bytes], Connection]:
    """Start the child (`CHILD_COMMAND FD`) on one end of a socket pair; return it and our end."""
    ours, theirs = socket.socketpair()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", CHILD_COMMAND, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # stdout may be a protocol (a READY line); the child logs on stderr
            env=env,
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return process, Connection(ours.detach())


def _ranked(rows: list[list[list[Any]]]) -> list[list[tuple[int, float]]]:
    """Top-logprob rows as (token, logprob) pairs again (JSON has no tuples)."""
    return [[(int(token), float(logprob)) for token, logprob in row] for row in rows]
