"""Trajectory files: JSON Lines and Parquet round trips are exact; broken files are refused by line/row."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from convert_helpers import call, reward
from shared_helpers import float_bits

from agl_bridge.convert import (
    ConvertOptions,
    Trajectory,
    TrajectoryFormatError,
    convert_attempt,
    read_trajectories,
    trajectory_from_json,
    trajectory_to_json,
    write_trajectories,
)
from agl_bridge.convert.io import iter_trajectories


def sample_trajectories() -> list[Trajectory]:
    """Trajectories exercising every field: splits, branches, classes, an excluded retry, -inf/-0.0/tiny
    logprobs, odd tasks."""
    odd = call(0, [1, 2], [3, 4, 5], versions=[1, 1, 2])
    odd.response_logprobs = [-math.inf, -0.0, -5e-324]
    calls = [
        odd,
        call(0, [1, 2], [6], choice=1),
        call(1, [1, 2, 3, 4, 5, 7], [8], agent="solver"),
        call(2, [99], [100]),  # sent again at 3: a retry, excluded
        call(3, [99], [101]),
        call(4, [42], [43], prefix_breaks=[{"message_index": 0, "kind": "template_error", "reason": "é ✓"}]),
    ]
    first = convert_attempt(
        calls,
        [reward(5, 0.1, "b"), reward(6, 1 / 3, "a"), reward(7, 1.0, "verifier", attempt_id=None)],
        "succeeded",
        ConvertOptions(reward_weights={"a": 0.7}, train_classes=("main", "side")),
        group_id="g-ü",
        task={"question": "2+2 ✓ \u2028", "nested": [1, 2.5, None, True], "empty": {}},
    )
    second = convert_attempt(
        [call(0, [5], [6], attempt_id="at-2", rollout_id="ro-2")],
        [],
        "succeeded",
        ConvertOptions(missing_reward="zero"),
        task="just a string",
    )
    assert isinstance(first, Trajectory) and isinstance(second, Trajectory)
    assert len(first.segments) == 4 and second.group_id is None
    assert [segment.call_class for segment in first.segments] == ["main", "main", "side", "side"]
    assert [(call.sequence, call.call_class) for call in first.excluded_calls] == [(2, "retry")]
    return [first, second]


def bits(trajectories: list[Trajectory]) -> list[bytes]:
    """Every logprob's exact bit pattern (== treats -0.0 and 0.0 alike)."""
    return float_bits(
        value
        for t in trajectories
        for s in t.segments
        for value in (*s.sampler_logprobs, t.reward, *t.rewards.values())
    )


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_round_trip_is_exact(tmp_path: Path, suffix: str) -> None:
    original = sample_trajectories()
    path = tmp_path / f"t{suffix}"
    assert write_trajectories(original, path) == 2
    loaded = read_trajectories(path)
    assert loaded == original
    assert bits(loaded) == bits(original)
    assert [list(t.rewards) for t in loaded] == [list(t.rewards) for t in original]  # key order kept


def test_the_format_is_told_by_content_not_name(tmp_path: Path) -> None:
    original = sample_trajectories()
    write_trajectories(original, tmp_path / "parquet.jsonl", "parquet")
    write_trajectories(original, tmp_path / "lines.parquet", "jsonl")
    assert read_trajectories(tmp_path / "parquet.jsonl") == original
    assert read_trajectories(tmp_path / "lines.parquet") == original


def test_jsonl_records_carry_the_documented_fields(tmp_path: Path) -> None:
    write_trajectories(sample_trajectories(), tmp_path / "t.jsonl")
    record = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])
    assert list(record) == [
        "rollout_id", "attempt_id", "group_id", "task", "reward", "rewards", "unattached_rewards",
        "missing_reward", "segments", "excluded_calls", "graph_warnings",
    ]  # fmt: skip
    segment = record["segments"][0]
    assert list(segment) == [
        "input_ids", "loss_mask", "sampler_logprobs", "policy_versions", "model", "split_kind", "split_reason",
        "call_class", "calls",
    ]  # fmt: skip
    assert list(segment["calls"][0]) == [
        "sequence", "choice_index", "response_start", "response_end", "agent_name", "finish_reason", "span_id",
        "rewards", "call_class", "parent_sequence",
    ]  # fmt: skip
    assert record["excluded_calls"][0]["call_class"] == "retry" and record["excluded_calls"][0]["reason"]
    assert record["segments"][1]["split_kind"] == "choice_branch"
    assert "-Infinity" in (tmp_path / "t.jsonl").read_text()


def test_parquet_columns_are_typed(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    write_trajectories(sample_trajectories(), tmp_path / "t.parquet")
    schema = pq.read_schema(tmp_path / "t.parquet")
    assert str(schema.field("reward").type) == "double"
    assert str(schema.field("task").type) == "string"
    segment = schema.field("segments").type.value_type
    assert str(segment.field("input_ids").type.value_type) == "int32"
    assert str(segment.field("loss_mask").type.value_type) == "int8"
    assert schema.metadata[b"agl_bridge.trajectory_format"] == b"2"


def test_a_broken_jsonl_line_is_named(tmp_path: Path) -> None:
    good = json.dumps(trajectory_to_json(sample_trajectories()[1]))
    broken = trajectory_to_json(sample_trajectories()[1])
    broken["segments"][0]["loss_mask"][0] = 1  # a prompt token marked as sampled
    path = tmp_path / "t.jsonl"
    path.write_text(f"{good}\n\n{json.dumps(broken)}\n")
    with pytest.raises(TrajectoryFormatError, match="line 3: .*loss_mask is not 1 exactly"):
        read_trajectories(path)
    path.write_text(f"{good}\n{{not json\n")
    with pytest.raises(TrajectoryFormatError, match="line 2"):
        read_trajectories(path)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda r: r.pop("reward"), "missing field 'reward'"),
        (lambda r: r["segments"][0]["policy_versions"].pop(), "policy_versions has 1 entries but input_ids has 2"),
        (lambda r: r["segments"][0]["sampler_logprobs"].__setitem__(0, -0.5), "must be 0.0 and -1"),
        (lambda r: r["segments"][0].__setitem__("split_kind", "whim"), "'whim' is not a valid SplitKind"),
        (lambda r: r.__setitem__("segments", []), "has no segments"),
    ],
)
def test_records_that_break_the_schema_are_refused(damage, message: str) -> None:
    record = json.loads(json.dumps(trajectory_to_json(sample_trajectories()[1])))
    damage(record)
    with pytest.raises(TrajectoryFormatError, match=message):
        trajectory_from_json(record)


def test_a_parquet_file_that_is_not_ours_is_refused(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1]}), tmp_path / "other.parquet")
    with pytest.raises(TrajectoryFormatError, match="no trajectory format mark"):
        read_trajectories(tmp_path / "other.parquet")


def test_reading_streams_and_a_missing_file_is_named(tmp_path: Path) -> None:
    write_trajectories(sample_trajectories() * 300, tmp_path / "many.parquet")
    stream = iter_trajectories(tmp_path / "many.parquet")
    assert next(stream).rollout_id == "ro-1"
    assert sum(1 for _ in stream) == 599
    with pytest.raises(FileNotFoundError, match="no trajectory file at"):
        read_trajectories(tmp_path / "nope.jsonl")
