"""The Tinker SDK's protobuf messages ⇄ our records: forward/backward requests in, their results and
sample results out.

The schema is the one the `tinker` SDK ships (`tinker.proto.tinker_public_pb2`, Apache-2.0); we import
it rather than keep a copy, so the server speaks exactly the SDK's version. Tensors travel as raw
little-endian bytes (float32 / int64 dense, or CSR); token chunks as int32 bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

from agl_bridge.primitives.datum import Datum
from agl_bridge.sampler.base import SampleResult


class WireError(ValueError):
    """A request the server cannot read; the message names the field (a "user" error to the SDK)."""


@dataclass(frozen=True)
class ProvenanceSpan:
    """`length` consecutive target positions of a datum, taken from recorded sequence `sequence_id` from its
    position `offset` on: its sampled tokens (`sampled`) or its prompt."""

    sampled: bool
    sequence_id: str
    offset: int
    length: int


@dataclass
class ForwardBackwardCall:
    """One decoded `/forward_backward` request; `provenance` holds each datum's target spans (empty: none)."""

    model_id: str
    seq_id: int
    data: list[Datum]
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    provenance: list[list[ProvenanceSpan]]


_DTYPES = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}

# How the SDK merges one metric over a call's chunks (it splits every key on ":"); ours are sums or means.
_REDUCTIONS = {"loss": "sum", "tokens": "sum", "num_datums": "sum", "time_s": "max"}


def decode_forward_backward(body: bytes) -> ForwardBackwardCall:
    """Parse a `ForwardBackwardRequest`; WireError naming the datum and field when one cannot be read."""
    request = pb.ForwardBackwardRequest()
    try:
        request.ParseFromString(body)
    except Exception as exc:  # protobuf's DecodeError has no stable import path across versions
        raise WireError(f"the body is not a ForwardBackwardRequest protobuf: {exc}") from exc
    config: dict[str, float | str] = dict(request.loss_fn_config)
    for key, value in request.loss_fn_config_v2.items():  # the SDK's newer map; strings travel only here
        config[key] = value.text if value.WhichOneof("value") == "text" else value.number
    return ForwardBackwardCall(
        model_id=request.model_id,
        seq_id=request.seq_id,
        data=[_datum(index, datum) for index, datum in enumerate(request.data)],
        loss_fn=request.loss_fn,
        loss_fn_config=config,
        forward_only=request.forward_only,
        provenance=[_spans(datum.loss_fn_input_spans) for datum in request.data],
    )


def encode_forward_backward(logprobs: Sequence[Any], metrics: Mapping[str, float]) -> bytes:
    """A `ForwardBackwardOutput`: each datum's trainer logprobs (float32) and the metrics as `name:reduction`."""
    record = pb.ArrayRecord(type_tag="ArrayRecord", num_datums=len(logprobs))
    chunks = [np.asarray(values, dtype="<f4").reshape(-1).tobytes() for values in logprobs]
    offsets = np.cumsum([0] + [len(chunk) for chunk in chunks], dtype="<i8")
    record.fields["logprobs"].CopyFrom(
        pb.BatchedTensor(data=b"".join(chunks), offsets=offsets.tobytes(), dtype=pb.DTYPE_FLOAT32)
    )
    output = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=[record])
    for name, value in metrics.items():
        output.metrics[metric_key(name)] = float(value)
    return output.SerializeToString()


def metric_key(name: str) -> str:
    """Our metric name as the SDK requires it: exactly one colon, `name:reduction`."""
    return f"{name.replace(':', '_')}:{_REDUCTIONS.get(name, 'mean')}"


def encode_sample(result: SampleResult, prompt_logprobs: Sequence[float | None] | None) -> bytes:
    """A `SampleResponse`: each sequence's tokens (the stop token included), logprobs and stop reason."""
    response = pb.SampleResponse()
    for sequence in result.sequences:
        response.sequences.append(
            pb.SampledSequence(
                stop_reason=pb.STOP_REASON_LENGTH if sequence.stop_reason == "length" else pb.STOP_REASON_STOP,
                tokens=np.asarray(sequence.tokens, dtype="<i4").tobytes(),
                logprobs=np.asarray(sequence.logprobs, dtype="<f4").tobytes(),
            )
        )
    if prompt_logprobs is not None:
        values = [math.nan if value is None else value for value in prompt_logprobs]
        response.prompt_logprobs = np.asarray(values, dtype="<f4").tobytes()
    return response.SerializeToString()


def _datum(index: int, datum: Any) -> Datum:
    tokens: list[int] = []
    for chunk in datum.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise WireError(
                f"data[{index}].model_input: a {kind} chunk; this server trains on text tokens only "
                "(images are not supported)"
            )
        tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype="<i4").tolist())
    inputs = {name: _tensor(index, name, tensor) for name, tensor in datum.loss_fn_inputs.items()}
    return Datum(model_input=tokens, loss_fn_inputs=inputs)


def _spans(spans: Any) -> list[ProvenanceSpan]:
    found = []
    for span in spans:
        kind = span.WhichOneof("span")
        if kind is not None:
            inner = getattr(span, kind)
            found.append(ProvenanceSpan(kind == "sampled_tokens", inner.sequence_id, inner.offset, inner.length))
    return found


def _tensor(index: int, name: str, tensor: Any) -> np.ndarray:
    where = f"data[{index}].loss_fn_inputs[{name!r}]"
    dtype = _DTYPES.get(tensor.dtype)
    if dtype is None:
        raise WireError(f"{where}: dtype {pb.DType.Name(tensor.dtype)} is not float32, int64 or int32")
    shape = tuple(tensor.shape)
    if tensor.WhichOneof("encoding") == "sparse_csr":
        if len(shape) != 2:
            raise WireError(f"{where}: a sparse tensor needs a 2-D shape, got {list(shape)}")
        csr = tensor.sparse_csr
        values = np.frombuffer(csr.values, dtype=np.dtype(dtype).newbyteorder("<"))
        rows = np.frombuffer(csr.crow_indices, dtype="<i8")
        columns = np.frombuffer(csr.col_indices, dtype="<i8")
        dense = np.zeros(shape, dtype=dtype)
        for row in range(shape[0]):
            dense[row, columns[rows[row] : rows[row + 1]]] = values[rows[row] : rows[row + 1]]
        return dense
    array = np.frombuffer(tensor.dense, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)
    if shape:
        if math.prod(shape) != array.size:
            raise WireError(f"{where}: {array.size} values do not fill shape {list(shape)}")
        array = array.reshape(shape)
    return array
