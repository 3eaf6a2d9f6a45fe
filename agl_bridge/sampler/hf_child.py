"""The child side of `HFProcessSampler`: an `HFSampler` served over a socket, in a process of its own.

Started as `python -c CHILD_COMMAND FD` with one end of a socket pair as FD; the messages are in
`hf_wire.py`. The first frame from the parent holds the `ChildOptions`. What the sampler hands out
(token events from its worker thread, results, call answers) goes into one outbox that a sender
thread drains: all that one decode step produced leaves as one frame, in the order it was made (a
request's tokens before its result). A cancelled request's future is cancelled here, so `HFSampler`
drops its rows at its next step. CLOSE, or the parent's end of the socket closing (the parent died),
closes the sampler: requests still running fail with `SamplerClosedError` and the process exits.
SIGINT is ignored: a terminal's Ctrl-C reaches the whole process group, and the parent decides when
this process stops.
"""

from __future__ import annotations

import concurrent.futures
import json
import queue
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from agl_bridge.quick_exit import skip_final_collection
from agl_bridge.sampler.hf_wire import (
    CALL,
    CALLS,
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
    decode_options,
    decode_params,
    encode_error,
    encode_info,
    encode_result,
    read_frame,
    read_tensors,
    write_frame,
)

CHILD_COMMAND = "import sys; from agl_bridge.sampler.hf_child import main; sys.exit(main(sys.argv[1:]))"
"""The `python -c` program that runs the child."""


class _Child:
    """Serves one sampler to the parent on the other end of `connection` (see the module docs)."""

    def __init__(self, connection: Connection, sampler: Any) -> None:
        self.connection = connection
        self.sampler = sampler
        self.outbox: queue.SimpleQueue[Message | None] = queue.SimpleQueue()
        self.running: dict[int, concurrent.futures.Future[Any]] = {}
        self.calls = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="agl-hf-child-call")
        self.sender = threading.Thread(target=self._send, name="agl-hf-child-sender", daemon=True)

    def serve(self) -> None:
        """Answer the parent's messages until CLOSE or until the parent goes away."""
        self.sender.start()
        try:
            while self._handle(self._next()):
                pass
        finally:
            self.sampler.close()  # fails what is still running: their answers are in the outbox
            self.calls.shutdown(wait=True)
            self.outbox.put([CLOSED])
            self.outbox.put(None)
            self.sender.join(timeout=30)

    def _next(self) -> list[Message]:
        try:
            return read_frame(self.connection)
        except (EOFError, OSError, ValueError):  # the parent is gone (or not one of ours)
            return [[CLOSE]]

    def _handle(self, messages: list[Message]) -> bool:
        for message in messages:
            kind = message[0]
            if kind == SAMPLE:
                self._sample(*message[1:])
            elif kind == CANCEL:
                future = self.running.pop(message[1], None)
                if future is not None:
                    future.cancel()
            elif kind == CALL:
                self._call(*message[1:])
            elif kind == CLOSE:
                return False
        return True

    def _sample(self, rid: int, prompt: list[int], params: dict[str, Any], num_samples: int, stream: bool) -> None:
        on_token = None
        if stream:
            outbox = self.outbox

            def on_token(event: Any) -> None:
                outbox.put([TOKEN, rid, event.sample_index, event.token, event.logprob, event.policy_version])

        try:
            future = self.sampler.submit(prompt, decode_params(params), num_samples, on_token=on_token)
        except Exception as error:  # refused before it was queued
            self.outbox.put([FAILED, rid, encode_error(error)])
            return
        self.running[rid] = future
        future.add_done_callback(lambda done: self._settled(rid, done))

    def _settled(self, rid: int, future: concurrent.futures.Future[Any]) -> None:
        self.running.pop(rid, None)
        if future.cancelled():
            return  # the parent cancelled it and expects nothing
        error = future.exception()
        self.outbox.put(
            [DONE, rid, encode_result(future.result())] if error is None else [FAILED, rid, encode_error(error)]
        )

    def _call(self, cid: int, name: str, args: list[Any], tensor_frames: int) -> None:
        tensors = [read_tensors(self.connection) for _ in range(tensor_frames)]
        arguments = [
            {name: tensors[arg["tensors"]][name] for name in arg["names"]}
            if isinstance(arg, dict) and "tensors" in arg
            else arg
            for arg in args
        ]
        if name not in CALLS:
            self.outbox.put([RAISED, cid, encode_error(ValueError(f"the sampler process has no call {name!r}"))])
            return
        sampler = self.sampler
        run: Callable[[], Any] = (
            (lambda: getattr(sampler, name))
            if isinstance(getattr(type(sampler), name, None), property)
            else (lambda: getattr(sampler, name)(*arguments))
        )
        self.calls.submit(self._answer, cid, run)

    def _answer(self, cid: int, run: Callable[[], Any]) -> None:
        try:
            self.outbox.put([RETURNED, cid, run()])
        except Exception as error:
            self.outbox.put([RAISED, cid, encode_error(error)])

    def _send(self) -> None:
        """Drain the outbox into frames until its end marker."""
        while True:
            item = self.outbox.get()
            frame: list[Message] = []
            while item is not None:
                frame.append(item)
                try:
                    item = self.outbox.get_nowait()
                except queue.Empty:
                    break
            if frame:
                try:
                    write_frame(self.connection, frame)
                except OSError:  # the parent is gone: nobody reads what is left
                    return
            if item is None:
                return


def _build(options: ChildOptions) -> tuple[Any, SamplerInfo]:
    import torch

    from agl_bridge.models.loading import load_causal_lm, load_tokenizer
    from agl_bridge.sampler.hf import HFSampler

    if options.torch_threads:
        torch.set_num_threads(options.torch_threads)
    model = load_causal_lm(options.model, device=options.device, dtype=options.dtype)
    try:
        tokenizer = load_tokenizer(options.model)
    except (OSError, ValueError):
        tokenizer = None  # token-id sampling works without one; only stop strings need it
    sampler = HFSampler(
        model,
        tokenizer,
        max_batch_size=options.max_batch_size,
        max_prefill_tokens=options.max_prefill_tokens,
        max_context=options.max_context,
        seed=options.seed,
    )
    output, inputs = model.get_output_embeddings(), model.get_input_embeddings()
    tied = output is not None and inputs is not None and output.weight.data_ptr() == inputs.weight.data_ptr()
    info = SamplerInfo(
        max_context=sampler.max_context,
        vocab_size=sampler.vocab_size,
        max_batch_size=sampler.max_batch_size,
        policy_version=sampler.policy_version,
        model_config=json.loads(model.config.to_json_string(use_diff=False)),
        embeddings_tied=tied,
    )
    return sampler, info


def main(argv: list[str]) -> int:
    """Serve a sampler on the socket whose descriptor is argv[0] (see the module docs)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    skip_final_collection()
    connection = Connection(int(argv[0]))
    try:
        ((kind, options),) = read_frame(connection)
    except (EOFError, OSError, ValueError):
        return 1
    if kind != OPTIONS:
        return 1
    try:
        sampler, info = _build(decode_options(options))
    except Exception as error:  # the parent raises it: a wrong path, an unsupported architecture, ...
        write_frame(connection, [[START_FAILED, encode_error(error)]])
        return 1
    write_frame(connection, [[READY, encode_info(info)]])
    _Child(connection, sampler).serve()
    return 0
