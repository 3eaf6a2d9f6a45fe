"""Trajectories on disk: JSON Lines and Parquet writers, and a reader that gives back the same records.

The schema (one trajectory per JSON line / Parquet row) is documented in docs/trajectories.md.
Both formats round-trip exactly: `read_trajectories(path)` returns trajectories equal to the ones
written, floats bit for bit (JSON: Python's shortest repr, -inf logprobs as `-Infinity`; Parquet:
float64), dict key order kept. In Parquet the task payload is a JSON text column (a task is any
JSON value, which has no fixed column type); token ids and policy versions are int32, like the
store's. The reader checks every segment's invariants (mask = the calls' response ranges, 0.0 and
-1 where the mask is 0) and raises TrajectoryFormatError naming the line or row that breaks them.
Writers stream: JSON Lines one line at a time, Parquet one row group per `row_group_size`
trajectories; the reader streams the same way (`iter_trajectories`).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, Protocol

from agl_bridge.convert.errors import TrajectoryFormatError
from agl_bridge.convert.records import ExcludedCall, SegmentCall, Trajectory, TrajectorySegment
from agl_bridge.export_files import ExportFormat

PARQUET_FORMAT_KEY = b"agl_bridge.trajectory_format"
"""Parquet schema metadata key holding the trajectory format version."""

FORMAT_VERSION = "2"
"""Version of the trajectory schema (docs/trajectories.md); bump when a field changes meaning.

Version 2 added the rollout graph: `call_class` on segments and calls, `parent_sequence` on calls,
`excluded_calls` and `graph_warnings` on trajectories. Version 1 files read with those empty."""

READABLE_VERSIONS = ("1", FORMAT_VERSION)
"""Trajectory format versions this reader accepts."""

DEFAULT_ROW_GROUP = 256
"""Trajectories per Parquet row group: bounds the writer's and reader's memory."""

_PARQUET_MAGIC = b"PAR1"

# allow_nan: a -inf logprob (which the store keeps) is written -Infinity and read back, as in the
# calls export; ASCII-escaped so the file is valid UTF-8 whatever the task text holds.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=True)
_TASK_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


# --- records ⇄ JSON-able dicts --------------------------------------------------------------------


def trajectory_to_json(trajectory: Trajectory) -> dict[str, Any]:
    """The JSON-able dict of a trajectory (the JSON Lines record)."""
    return {
        "rollout_id": trajectory.rollout_id,
        "attempt_id": trajectory.attempt_id,
        "group_id": trajectory.group_id,
        "task": trajectory.task,
        "reward": trajectory.reward,
        "rewards": trajectory.rewards,
        "unattached_rewards": trajectory.unattached_rewards,
        "missing_reward": trajectory.missing_reward,
        "segments": [_segment_to_json(segment) for segment in trajectory.segments],
        "excluded_calls": [
            {
                "sequence": call.sequence,
                "choice_index": call.choice_index,
                "call_class": call.call_class.value,
                "parent_sequence": call.parent_sequence,
                "reason": call.reason,
            }
            for call in trajectory.excluded_calls
        ],
        "graph_warnings": trajectory.graph_warnings,
    }


def _segment_to_json(segment: TrajectorySegment) -> dict[str, Any]:
    return {
        "input_ids": segment.input_ids,
        "loss_mask": segment.loss_mask,
        "sampler_logprobs": segment.sampler_logprobs,
        "policy_versions": segment.policy_versions,
        "model": segment.model,
        "split_kind": None if segment.split_kind is None else segment.split_kind.value,
        "split_reason": segment.split_reason,
        "call_class": None if segment.call_class is None else segment.call_class.value,
        "calls": [
            {
                "sequence": call.sequence,
                "choice_index": call.choice_index,
                "response_start": call.response_start,
                "response_end": call.response_end,
                "agent_name": call.agent_name,
                "finish_reason": call.finish_reason,
                "span_id": call.span_id,
                "rewards": call.rewards,
                "call_class": None if call.call_class is None else call.call_class.value,
                "parent_sequence": call.parent_sequence,
            }
            for call in segment.calls
        ],
    }


def trajectory_from_json(record: dict[str, Any]) -> Trajectory:
    """Rebuild a trajectory from its JSON-able dict, checking its invariants (TrajectoryFormatError)."""
    try:
        segments = [
            TrajectorySegment(
                input_ids=segment["input_ids"],
                loss_mask=segment["loss_mask"],
                sampler_logprobs=segment["sampler_logprobs"],
                policy_versions=segment["policy_versions"],
                model=segment["model"],
                split_kind=segment["split_kind"],
                split_reason=segment["split_reason"],
                call_class=segment.get("call_class"),
                calls=[SegmentCall(**_dict_fields(call)) for call in segment["calls"]],
            )
            for segment in record["segments"]
        ]
        trajectory = Trajectory(
            rollout_id=record["rollout_id"],
            attempt_id=record["attempt_id"],
            group_id=record["group_id"],
            task=record["task"],
            reward=record["reward"],
            rewards=_float_dict(record["rewards"]),
            unattached_rewards=_float_dict(record["unattached_rewards"]),
            missing_reward=record["missing_reward"],
            segments=segments,
            excluded_calls=[ExcludedCall(**call) for call in record.get("excluded_calls") or []],
            graph_warnings=list(record.get("graph_warnings") or []),
        )
    except KeyError as exc:
        raise TrajectoryFormatError(f"missing field {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise TrajectoryFormatError(str(exc)) from None
    for index, segment in enumerate(trajectory.segments):
        check_segment(segment, where=f"segment {index}")
    return trajectory


def _dict_fields(call: dict[str, Any]) -> dict[str, Any]:
    fields = dict(call)
    fields["rewards"] = _float_dict(fields["rewards"])
    return fields


def _float_dict(value: Any) -> dict[str, float]:
    # Parquet maps come back as (key, value) pairs; JSON objects as dicts.
    pairs = value.items() if isinstance(value, dict) else value
    return {str(name): float(number) for name, number in pairs}


def check_segment(segment: TrajectorySegment, *, where: str = "segment") -> None:
    """Raise TrajectoryFormatError unless the mask is 1 exactly on the calls' responses and 0.0 / -1 elsewhere."""
    expected = [0] * len(segment.input_ids)
    end = 0
    for call in segment.calls:
        if call.response_start < end:
            raise TrajectoryFormatError(
                f"{where}: the call at sequence {call.sequence} starts its response at token "
                f"{call.response_start}, inside the previous call's response (ends at {end})"
            )
        expected[call.response_start : call.response_end] = [1] * (call.response_end - call.response_start)
        end = call.response_end
    if segment.loss_mask != expected:
        raise TrajectoryFormatError(f"{where}: loss_mask is not 1 exactly on the calls' response tokens")
    for mask, logprob, version in zip(
        segment.loss_mask, segment.sampler_logprobs, segment.policy_versions, strict=False
    ):
        if not mask and (logprob != 0.0 or version != -1):
            raise TrajectoryFormatError(
                f"{where}: a prompt/observation token (mask 0) has sampler logprob {logprob} and policy "
                f"version {version}; they must be 0.0 and -1"
            )


# --- writers ---------------------------------------------------------------------------------------


class TrajectoryWriter(Protocol):
    """Writes trajectories one at a time into an open file; `close()` finishes the file (not the handle)."""

    def write(self, trajectory: Trajectory) -> None:
        """Append one trajectory."""
        ...

    def close(self) -> None:
        """Flush what is buffered and write any footer; the handle stays open."""
        ...

    def abort(self) -> None:
        """Give up after a failure: release the writer without raising (the file is discarded)."""
        ...


class JsonlTrajectoryWriter:
    """One JSON object per line into a text handle."""

    def __init__(self, handle: IO[str]) -> None:
        self._handle = handle

    def write(self, trajectory: Trajectory) -> None:
        """Append one trajectory as a line."""
        self._handle.write(_ENCODER.encode(trajectory_to_json(trajectory)))
        self._handle.write("\n")

    def close(self) -> None:
        """Nothing is buffered here; the caller flushes the handle."""

    def abort(self) -> None:
        """Nothing to release."""


class ParquetTrajectoryWriter:
    """Parquet rows (schema: `arrow_schema()`) into a binary handle, one row group per `row_group_size`."""

    def __init__(self, handle: IO[bytes], *, row_group_size: int = DEFAULT_ROW_GROUP) -> None:
        if row_group_size < 1:
            raise ValueError(f"row_group_size must be >= 1, got {row_group_size}")
        pa, pq = _arrow()
        self._pa = pa
        self._schema = arrow_schema()
        self._writer = pq.ParquetWriter(handle, self._schema)
        self._rows: list[dict[str, Any]] = []
        self._row_group_size = row_group_size

    def write(self, trajectory: Trajectory) -> None:
        """Buffer one trajectory; a full row group is written out."""
        row = trajectory_to_json(trajectory)
        row["task"] = _TASK_ENCODER.encode(trajectory.task)
        self._rows.append(row)
        if len(self._rows) >= self._row_group_size:
            self._flush()

    def close(self) -> None:
        """Write the last row group and the footer."""
        self._flush()
        self._writer.close()

    def abort(self) -> None:
        """Drop buffered rows and close the Parquet writer while its handle is still open.

        Left to the garbage collector, pyarrow would try to finish the file after the handle is
        closed and print an ignored "write to closed file" error.
        """
        self._rows = []
        with contextlib.suppress(Exception):
            self._writer.close()

    def _flush(self) -> None:
        if self._rows:
            self._writer.write_table(self._pa.Table.from_pylist(self._rows, schema=self._schema))
            self._rows = []


def open_writer(handle: IO[Any], file_format: ExportFormat | str) -> TrajectoryWriter:
    """A writer of `file_format` ("jsonl": text handle; "parquet": binary handle)."""
    if ExportFormat(file_format) is ExportFormat.PARQUET:
        return ParquetTrajectoryWriter(handle)
    return JsonlTrajectoryWriter(handle)


def format_of_path(path: str | os.PathLike[str]) -> ExportFormat:
    """The format a file name asks for: ".parquet" / ".pq" → Parquet, anything else JSON Lines."""
    return ExportFormat.PARQUET if Path(path).suffix.lower() in (".parquet", ".pq") else ExportFormat.JSONL


def write_trajectories(
    trajectories: Iterable[Trajectory], path: str | os.PathLike[str], file_format: ExportFormat | str | None = None
) -> int:
    """Write `trajectories` to `path` (format from the name unless given); returns how many."""
    chosen = format_of_path(path) if file_format is None else ExportFormat(file_format)
    count = 0
    mode = "wb" if chosen is ExportFormat.PARQUET else "w"
    text_options: dict[str, Any] = {} if "b" in mode else {"encoding": "utf-8", "newline": "\n"}
    with open(path, mode, **text_options) as handle:
        writer = open_writer(handle, chosen)
        try:
            for trajectory in trajectories:
                writer.write(trajectory)
                count += 1
        except BaseException:
            writer.abort()
            raise
        writer.close()
    return count


# --- reading ---------------------------------------------------------------------------------------


def iter_trajectories(path: str | os.PathLike[str]) -> Iterator[Trajectory]:
    """Stream the trajectories of a JSON Lines or Parquet file (told apart by content, not name)."""
    where = Path(path)
    if not where.is_file():
        raise FileNotFoundError(
            f"no trajectory file at {where}; export one with `agl-bridge export --what trajectories`"
        )
    with where.open("rb") as probe:
        is_parquet = probe.read(4) == _PARQUET_MAGIC
    yield from (_iter_parquet(where) if is_parquet else _iter_jsonl(where))


def read_trajectories(path: str | os.PathLike[str]) -> list[Trajectory]:
    """Every trajectory of a JSON Lines or Parquet file, in file order."""
    return list(iter_trajectories(path))


def _iter_jsonl(path: Path) -> Iterator[Trajectory]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                yield trajectory_from_json(json.loads(line))
            except (json.JSONDecodeError, TrajectoryFormatError) as exc:
                raise TrajectoryFormatError(f"{path} line {number}: not a trajectory record: {exc}") from None


def _iter_parquet(path: Path) -> Iterator[Trajectory]:
    _, pq = _arrow()
    parquet = pq.ParquetFile(path)
    version = (parquet.schema_arrow.metadata or {}).get(PARQUET_FORMAT_KEY)
    if version is None or version.decode() not in READABLE_VERSIONS:
        found = "no trajectory format mark" if version is None else f"trajectory format {version.decode()!r}"
        raise TrajectoryFormatError(
            f"{path} is a Parquet file with {found}; this agl_bridge reads formats {', '.join(READABLE_VERSIONS)} "
            "(export it again with `agl-bridge export --what trajectories --format parquet`)"
        )
    row = 0
    for batch in parquet.iter_batches(batch_size=DEFAULT_ROW_GROUP):
        for record in batch.to_pylist():
            row += 1
            try:
                record["task"] = json.loads(record["task"])
                yield trajectory_from_json(record)
            except (json.JSONDecodeError, TrajectoryFormatError) as exc:
                raise TrajectoryFormatError(f"{path} row {row}: not a trajectory record: {exc}") from None


# --- the Arrow schema --------------------------------------------------------------------------------


def _arrow() -> tuple[Any, Any]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(
            "Parquet needs pyarrow, which is not installed; `pip install pyarrow`, or use --format jsonl"
        ) from None
    return pa, pq


def arrow_schema() -> Any:
    """The Parquet/Arrow schema of a trajectory row (docs/trajectories.md), with the format mark."""
    pa, _ = _arrow()

    def required(name: str, kind: Any) -> Any:
        return pa.field(name, kind, nullable=False)

    def ints(kind: Any) -> Any:
        return pa.list_(pa.field("element", kind, nullable=False))

    rewards = pa.map_(pa.string(), pa.float64())
    call = pa.struct(
        [
            required("sequence", pa.int64()),
            required("choice_index", pa.int32()),
            required("response_start", pa.int64()),
            required("response_end", pa.int64()),
            pa.field("agent_name", pa.string()),
            pa.field("finish_reason", pa.string()),
            pa.field("span_id", pa.string()),
            required("rewards", rewards),
            pa.field("call_class", pa.string()),
            pa.field("parent_sequence", pa.int64()),
        ]
    )
    excluded = pa.struct(
        [
            required("sequence", pa.int64()),
            required("choice_index", pa.int32()),
            required("call_class", pa.string()),
            pa.field("parent_sequence", pa.int64()),
            required("reason", pa.string()),
        ]
    )
    segment = pa.struct(
        [
            required("input_ids", ints(pa.int32())),
            required("loss_mask", ints(pa.int8())),
            required("sampler_logprobs", ints(pa.float64())),
            required("policy_versions", ints(pa.int32())),
            required("model", pa.string()),
            pa.field("split_kind", pa.string()),
            pa.field("split_reason", pa.string()),
            pa.field("call_class", pa.string()),
            required("calls", pa.list_(pa.field("element", call, nullable=False))),
        ]
    )
    return pa.schema(
        [
            required("rollout_id", pa.string()),
            required("attempt_id", pa.string()),
            pa.field("group_id", pa.string()),
            required("task", pa.string()),
            required("reward", pa.float64()),
            required("rewards", rewards),
            required("unattached_rewards", rewards),
            required("missing_reward", pa.bool_()),
            required("segments", pa.list_(pa.field("element", segment, nullable=False))),
            required("excluded_calls", pa.list_(pa.field("element", excluded, nullable=False))),
            required("graph_warnings", pa.list_(pa.field("element", pa.string(), nullable=False))),
        ],
        metadata={PARQUET_FORMAT_KEY: FORMAT_VERSION.encode()},
    )
