"""The wire between `HFProcessSampler` and its child (`hf_child.py`): frames, messages, and their codecs.

Every frame, both ways, is one JSON list of messages; a message is a list whose first item names it.
Nothing is unpickled: values are plain JSON (floats round-trip exactly: Python writes the shortest
repr), tensors travel as safetensors bytes in frames of their own right after the message that
needs them, and an error is rebuilt only as one of `KNOWN_ERRORS` (else a RuntimeError naming it).

    parent → child   OPTIONS (ChildOptions) first; then SAMPLE (rid, prompt ids, SamplingParams,
                     num_samples, stream?), CANCEL (rid), CALL (cid, one of CALLS, args, tensor frames),
                     CLOSE
    child → parent   READY (SamplerInfo) or START_FAILED (error) first; then TOKEN (rid, sample index,
                     id, logprob, policy version) for streamed requests, DONE (rid, SampleResult) or
                     FAILED (rid, error), RETURNED (cid, value) or RAISED (cid, error); CLOSED last
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from agl_bridge.sampler.base import (
    ContextLengthError,
    SampledSequence,
    SampleResult,
    SamplingParamError,
    SamplingParams,
)
from agl_bridge.sampler.hf import SamplerClosedError
from agl_bridge.sampler.kv_batch import UnsupportedArchitectureError

OPTIONS, SAMPLE, CANCEL, CALL, CLOSE = "options", "sample", "cancel", "call", "close"
READY, START_FAILED, TOKEN, DONE, FAILED, RETURNED, RAISED, CLOSED = (
    "ready",
    "start_failed",
    "token",
    "done",
    "failed",
    "returned",
    "raised",
    "closed",
)
CALLS = frozenset(
    {"compute_logprobs", "compute_top_logprobs", "load_weights", "load_lora", "running_sequences", "policy_version"}
)
"""The sampler methods (and properties, called without arguments) a CALL may name."""

KNOWN_ERRORS: dict[str, type[BaseException]] = {
    kind.__name__: kind
    for kind in (
        ContextLengthError,
        SamplingParamError,
        UnsupportedArchitectureError,
        SamplerClosedError,
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        OSError,
        FileNotFoundError,
        NotImplementedError,
        MemoryError,
        RuntimeError,
    )
}
"""The exceptions that cross the wire as themselves: ours, and the builtins a sampler raises."""

Message = list[Any]


@dataclass(frozen=True)
class ChildOptions:
    """How the child builds its sampler: the `HFSampler` arguments and the model to load (dtype by name)."""

    model: str
    device: str = "cpu"
    dtype: str | None = None
    max_batch_size: int = 64
    max_prefill_tokens: int = 16384
    max_context: int | None = None
    seed: int | None = None
    torch_threads: int | None = None


@dataclass(frozen=True)
class SamplerInfo:
    """What the parent answers from without asking the child: sizes, the starting policy version, the model's
    config (as a dict) and whether its output layer shares the input embeddings' weight."""

    max_context: int
    vocab_size: int
    max_batch_size: int
    policy_version: int
    model_config: dict[str, Any]
    embeddings_tied: bool


def write_frame(connection: Connection, messages: list[Message], tensor_frames: Sequence[bytes] = ()) -> None:
    """Send `messages` as one frame, then each of `tensor_frames` (the tensors a CALL among them carries)."""
    connection.send_bytes(json.dumps(messages, separators=(",", ":")).encode())
    for frame in tensor_frames:
        connection.send_bytes(frame)


def read_frame(connection: Connection) -> list[Message]:
    """The next frame's messages; EOFError once the other end is closed."""
    messages = json.loads(connection.recv_bytes())
    if not isinstance(messages, list) or not all(isinstance(m, list) and m for m in messages):
        raise ValueError("a sampler frame must be a list of messages")
    return messages


def read_tensors(connection: Connection) -> dict[str, torch.Tensor]:
    """The next frame as the tensors a CALL carries."""
    return load_tensors(connection.recv_bytes())


def tensor_frame(state_dict: Mapping[str, torch.Tensor]) -> bytes:
    """A state dict as one frame: CPU copies (they may be live views of a trainer's parameters, on a GPU, or
    share storage), in safetensors' format."""
    return bytes(
        save_tensors({name: value.detach().to("cpu", copy=True).contiguous() for name, value in state_dict.items()})
    )


def encode_options(options: ChildOptions) -> dict[str, Any]:
    """`options` as JSON values."""
    return dataclasses.asdict(options)


def decode_options(value: Mapping[str, Any]) -> ChildOptions:
    """The `ChildOptions` `encode_options` wrote."""
    return ChildOptions(**value)


def encode_info(info: SamplerInfo) -> dict[str, Any]:
    """`info` as JSON values."""
    return dataclasses.asdict(info)


def decode_info(value: Mapping[str, Any]) -> SamplerInfo:
    """The `SamplerInfo` `encode_info` wrote."""
    return SamplerInfo(**value)


def encode_params(params: SamplingParams) -> dict[str, Any]:
    """`params` as JSON values (a stop tuple becomes a list; None and [] stay apart)."""
    fields = dataclasses.asdict(params)
    if isinstance(params.stop, Sequence) and not isinstance(params.stop, str):
        fields["stop"] = list(params.stop)
    return fields


def decode_params(value: Mapping[str, Any]) -> SamplingParams:
    """The `SamplingParams` `encode_params` wrote."""
    return SamplingParams(**value)


def encode_result(result: SampleResult) -> dict[str, Any]:
    """`result` as JSON values."""
    return dataclasses.asdict(result)


def decode_result(value: Mapping[str, Any]) -> SampleResult:
    """The `SampleResult` `encode_result` wrote."""
    return SampleResult(list(value["prompt_tokens"]), [SampledSequence(**s) for s in value["sequences"]])


def encode_error(error: BaseException) -> dict[str, Any]:
    """An exception as its type's name, the arguments that rebuild it, and its message."""
    arguments = error.__reduce__()[1]
    try:
        json.dumps(arguments)
    except (TypeError, ValueError):
        arguments = None
    return {"type": type(error).__name__, "args": arguments, "message": str(error)}


def decode_error(value: Mapping[str, Any]) -> BaseException:
    """The exception `encode_error` wrote, rebuilt if it is one of `KNOWN_ERRORS`; else a RuntimeError
    that names its type and says what it said."""
    kind = KNOWN_ERRORS.get(str(value.get("type")))
    arguments = value.get("args")
    if kind is not None and isinstance(arguments, list):
        try:
            return kind(*arguments)
        except Exception:  # the arguments do not fit the type: keep the words
            pass
    return RuntimeError(f"{value.get('type')}: {value.get('message')}")
