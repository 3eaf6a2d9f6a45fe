"""JSON Lines export: exact round-trips, order, the rollout filter, streaming, and output errors."""

from __future__ import annotations

import json
import math
import os
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from shared_helpers import float_bits

from agl_bridge.export_files import ExportCounts, ExportOutputError
from agl_bridge.store import RolloutNotFoundError, SQLiteStore, StoreError
from agl_bridge.store.export import (
    NoStoreError,
    call_record,
    check_store_file,
    export_calls,
    record_from_json,
)
from agl_bridge.types import AttemptStatus, CallClass, LLMCall, Reward, Usage

TRICKY_LOGPROBS = [-0.0, 0.0, -5e-324, -1 / 3, -math.pi, -1.7976931348623157e308, -math.inf, -2.220446049250313e-16]

CALL_FIELDS = {
    "kind", "rollout_id", "attempt_id", "sequence", "model", "call_kind", "prompt_token_ids", "response_token_ids",
    "response_logprobs", "token_policy_versions", "policy_version", "messages", "response_text", "finish_reason",
    "choice_index", "agent_name", "prefix_breaks", "started_at", "ended_at", "usage", "span_id", "trace_id",
    "declared_class", "declared_parent", "carries",
}  # fmt: skip
REWARD_FIELDS = {"kind", "rollout_id", "attempt_id", "name", "value", "sequence", "timestamp", "span_id", "trace_id"}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def store_order(record: LLMCall | Reward) -> tuple[str, str, int, int, int]:
    """The documented export order, computed independently of the exporter."""
    is_reward = isinstance(record, Reward)
    choice = 0 if is_reward else record.choice_index  # type: ignore[union-attr]
    return (record.rollout_id or "", record.attempt_id or "", record.sequence or 0, int(is_reward), choice)


async def populate(store: SQLiteStore, make_call: Callable[..., LLMCall]) -> list[LLMCall | Reward]:
    """Two rollouts (one retried), a text call, a 2-choice call, records outside any rollout or attempt.

    Returns every stored record with the sequence the store gave it.
    """
    written: list[LLMCall | Reward] = []

    async def call(**fields: Any) -> None:
        record = make_call(**fields)
        record.sequence = await store.add_llm_call(record)
        written.append(record)

    async def reward(**fields: Any) -> None:
        record = Reward(**fields)
        record.sequence = await store.add_reward(record)
        written.append(record)

    await store.create_rollout({"question": "2+2"}, group_id="g-1", rollout_id="ro-a")
    await store.create_rollout({"question": "3+3"}, group_id="g-1", rollout_id="ro-b")
    first = await store.start_attempt("ro-a")
    await call(rollout_id="ro-a", attempt_id=first.attempt_id, response_logprobs=[-0.1, -0.2], finish_reason="length")
    await reward(rollout_id="ro-a", attempt_id=first.attempt_id, value=0.1, name="partial", timestamp=10.5)
    await store.finish_attempt(first.attempt_id, AttemptStatus.FAILED, error="runner died")
    second = await store.start_attempt("ro-a")
    await call(
        rollout_id="ro-a",
        attempt_id=second.attempt_id,
        prompt_token_ids=[151_643, 0, 2**31 - 1],
        response_token_ids=list(range(len(TRICKY_LOGPROBS))),
        response_logprobs=TRICKY_LOGPROBS,
        token_policy_versions=[7, 7, 7, 8, 8, 8, 8, 8],
        messages=[{"role": "user", "content": "héllo ✓ \u0000 😀"}, {"role": "assistant", "content": None}],
        response_text="4 [bold]not markup[/bold]\n",
        agent_name="solver",
        started_at=1_700_000_000.123456,
        ended_at=1_700_000_001.987654,
        prefix_breaks=[{"turn": 2, "reason": "template dropped <think>"}],
        span_id="00f067aa0ba902b7",
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
        usage=Usage(input_tokens=3, output_tokens=8),
        declared_class=CallClass.SUBAGENT,
        declared_parent="0",
    )
    # A second choice of the same completion: same sequence, next choice_index.
    await call(rollout_id="ro-a", attempt_id=second.attempt_id, sequence=written[-1].sequence, choice_index=1)
    await reward(rollout_id="ro-a", attempt_id=second.attempt_id, value=1 / 3, name="correct", timestamp=11.25)
    await reward(rollout_id="ro-a", attempt_id=second.attempt_id, value=-5e-324, name="format", timestamp=11.5)
    await call(rollout_id="ro-a", attempt_id=second.attempt_id, response_logprobs=[-1e-300, -2.5],
               declared_class=CallClass.RETRY, declared_parent="resp_unresolved")  # fmt: skip
    b_attempt = await store.start_attempt("ro-b")
    await call(rollout_id="ro-b", attempt_id=b_attempt.attempt_id, kind="text", prompt_token_ids=[],
               response_token_ids=[], response_logprobs=[], response_text="six")  # fmt: skip
    await reward(rollout_id="ro-b", attempt_id=b_attempt.attempt_id, value=1.0, timestamp=12.0)
    await call(rollout_id="ro-b", attempt_id=None, response_text="rollout-level call, no attempt")
    await call(rollout_id=None, attempt_id=None, response_logprobs=[-math.inf, -0.5], response_text="no rollout")
    await reward(value=0.7, name="offline", timestamp=13.0)
    return written


async def test_every_field_of_every_record_round_trips_exactly(
    store: SQLiteStore, make_call: Callable[..., LLMCall], tmp_path: Path
) -> None:
    written = await populate(store, make_call)
    out = tmp_path / "calls.jsonl"
    counts = await export_calls(store, out)
    assert counts == ExportCounts(calls=7, rewards=5)
    lines = read_jsonl(out)
    assert len(lines) == 12
    for line in lines:
        assert set(line) == (CALL_FIELDS if line["kind"] == "llm_call" else REWARD_FIELDS)
    declared = [(line["declared_class"], line["declared_parent"]) for line in lines if line.get("declared_class")]
    assert sorted(declared) == [("retry", "resp_unresolved"), ("subagent", "0")]  # the class as its word
    rebuilt = [record_from_json(line) for line in lines]
    assert sorted(rebuilt, key=store_order) == sorted(written, key=store_order)  # dataclass equality: every field
    for got, sent in zip(sorted(rebuilt, key=store_order), sorted(written, key=store_order), strict=True):
        if isinstance(sent, LLMCall):
            assert float_bits(got.response_logprobs) == float_bits(sent.response_logprobs)  # type: ignore[union-attr]
        else:
            assert float_bits([got.value]) == float_bits([sent.value])  # type: ignore[union-attr]


async def test_records_carry_the_documented_names_and_values(
    store: SQLiteStore, make_call: Callable[..., LLMCall], tmp_path: Path
) -> None:
    await populate(store, make_call)
    out = tmp_path / "calls.jsonl"
    await export_calls(store, out)
    lines = read_jsonl(out)
    rich = next(line for line in lines if line["span_id"] == "00f067aa0ba902b7")
    assert rich["kind"] == "llm_call" and rich["call_kind"] == "token" and rich["rollout_id"] == "ro-a"
    assert rich["usage"] == {"input_tokens": 3, "output_tokens": 8}
    assert rich["policy_version"] == 7 and rich["choice_index"] == 0
    assert rich["prompt_token_ids"] == [151_643, 0, 2**31 - 1]
    assert float_bits(rich["response_logprobs"]) == float_bits(TRICKY_LOGPROBS)
    assert rich["messages"][0]["content"] == "héllo ✓ \u0000 😀"
    assert [line["call_kind"] for line in lines if line["kind"] == "llm_call"].count("text") == 1
    offline = [line for line in lines if line["rollout_id"] is None]
    assert [(line["kind"], line["attempt_id"]) for line in offline] == [("llm_call", None), ("reward", None)]
    assert offline[1] == {"kind": "reward", "rollout_id": None, "attempt_id": None, "sequence": 1, "name": "offline",
                          "value": 0.7, "timestamp": 13.0, "span_id": None, "trace_id": None}  # fmt: skip
    assert out.read_bytes().isascii()  # escaped: valid UTF-8 whatever the text holds


async def test_order_is_rollout_attempt_then_sequence_with_rewards_interleaved(
    store: SQLiteStore, make_call: Callable[..., LLMCall], tmp_path: Path
) -> None:
    written = await populate(store, make_call)
    out = tmp_path / "calls.jsonl"
    await export_calls(store, out)
    got = [record_from_json(line) for line in read_jsonl(out)]
    assert got == sorted(written, key=store_order)
    assert got[0].rollout_id is None and got[1].rollout_id is None  # records outside any rollout first
    # Within each (rollout, attempt) the sequence never goes down and the groups are contiguous.
    seen: list[tuple[str | None, str | None]] = []
    for previous, record in zip(got, got[1:], strict=False):
        if (record.rollout_id, record.attempt_id) == (previous.rollout_id, previous.attempt_id):
            assert (record.sequence or 0) >= (previous.sequence or 0)
        else:
            assert (record.rollout_id, record.attempt_id) not in seen
            seen.append((previous.rollout_id, previous.attempt_id))
    kinds = [type(r).__name__ for r in got if r.rollout_id == "ro-a" and r.attempt_id == written[3].attempt_id]
    assert kinds == ["LLMCall", "LLMCall", "Reward", "Reward", "LLMCall"]  # both choices, then rewards, then next call


async def test_rollout_filter_keeps_only_that_rollout(
    store: SQLiteStore, make_call: Callable[..., LLMCall], tmp_path: Path
) -> None:
    written = await populate(store, make_call)
    out = tmp_path / "ro-b.jsonl"
    counts = await export_calls(store, out, rollout_id="ro-b")
    expected = sorted((r for r in written if r.rollout_id == "ro-b"), key=store_order)
    assert counts == ExportCounts(calls=2, rewards=1)
    assert [record_from_json(line) for line in read_jsonl(out)] == expected
    assert expected[0].attempt_id is None  # the rollout's records outside any attempt come first


async def test_rollout_known_only_from_its_records_is_exported(
    store: SQLiteStore, make_call: Callable[..., LLMCall], tmp_path: Path
) -> None:
    await store.add_reward(Reward(rollout_id="ext-1", attempt_id="ext-at", value=2.0))  # a runner elsewhere
    counts = await export_calls(store, tmp_path / "ext.jsonl", rollout_id="ext-1")
    assert counts == ExportCounts(calls=0, rewards=1)


async def test_unknown_rollout_is_refused_and_leaves_the_output_alone(
    store: SQLiteStore, make_call: Callable[..., LLMCall], tmp_path: Path
) -> None:
    await populate(store, make_call)
    out = tmp_path / "calls.jsonl"
    out.write_text("previous export\n")
    with pytest.raises(RolloutNotFoundError) as info:
        await export_calls(store, out, rollout_id="ro-zzz")
    assert info.value.rollout_id == "ro-zzz"
    assert out.read_text() == "previous export\n"


async def test_empty_store_exports_an_empty_file(store: SQLiteStore, tmp_path: Path) -> None:
    out = tmp_path / "empty.jsonl"
    assert await export_calls(store, out) == ExportCounts(calls=0, rewards=0)
    assert out.read_bytes() == b""


async def test_output_replaces_atomically_and_is_private(
    store: SQLiteStore, make_call: Callable[..., LLMCall], tmp_path: Path
) -> None:
    await populate(store, make_call)
    out = tmp_path / "calls.jsonl"
    out.write_text("old\n")
    await export_calls(store, out)
    assert len(read_jsonl(out)) == 12
    assert os.stat(out).st_mode & 0o777 == 0o600  # prompts may be private, like the store itself
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left


async def test_a_failure_mid_export_leaves_no_partial_file(
    store: SQLiteStore, make_call: Callable[..., LLMCall], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await populate(store, make_call)

    async def broken_rewards():  # the store failing after a few records
        yield Reward(value=1.0, sequence=0)
        raise StoreError("could not read store: disk I/O error")

    monkeypatch.setattr(store, "iter_all_rewards", broken_rewards)
    out = tmp_path / "calls.jsonl"
    out.write_text("previous export\n")
    with pytest.raises(StoreError, match="disk I/O error"):
        await export_calls(store, out)
    assert out.read_text() == "previous export\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.slow
async def test_export_streams_in_bounded_memory(tmp_path: Path) -> None:
    # 1,500 calls of 400 tokens: ~36 MB once decoded into Python objects. Streaming in pages of 16
    # keeps only a few calls alive; loading the store first would trip the bound below.
    n_calls, n_tokens = 1_500, 400
    path = tmp_path / "big.db"
    async with SQLiteStore(path, read_page_size=16) as store:
        await store.create_rollout({}, rollout_id="ro-big")
        attempt = await store.start_attempt("ro-big")
        calls = [
            LLMCall(
                rollout_id="ro-big",
                attempt_id=attempt.attempt_id,
                model="tiny",
                prompt_token_ids=list(range(i % 7, i % 7 + 8)),
                response_token_ids=[(i + j) % 50_000 for j in range(n_tokens)],
                response_logprobs=[-(i + j) / 997.0 for j in range(n_tokens)],
            )
            for i in range(n_calls)
        ]
        await store.add_llm_calls(calls)
        del calls
        out = tmp_path / "big.jsonl"
        tracemalloc.start()
        try:
            counts = await export_calls(store, out)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert counts == ExportCounts(calls=n_calls, rewards=0)
    assert peak < 4_000_000, f"export held {peak / 1e6:.1f} MB at its peak; it should stream"
    with out.open() as lines:
        last = None
        for index, line in enumerate(lines):
            last = json.loads(line)
            assert last["sequence"] == index
    assert last is not None and last["response_logprobs"][-1] == -(n_calls - 1 + n_tokens - 1) / 997.0


@pytest.mark.parametrize("case", ["missing directory", "parent is a file", "out is a directory"])
async def test_unwritable_output_is_reported_before_reading(store: SQLiteStore, tmp_path: Path, case: str) -> None:
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "adir").mkdir()
    out = {
        "missing directory": tmp_path / "no" / "such" / "calls.jsonl",
        "parent is a file": tmp_path / "file.txt" / "calls.jsonl",
        "out is a directory": tmp_path / "adir",
    }[case]
    with pytest.raises(ExportOutputError) as info:
        await export_calls(store, out)
    message = str(info.value)
    assert str(out) in message and "\n" not in message
    assert not (tmp_path / "no").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories anyway")
async def test_read_only_directory_is_reported(store: SQLiteStore, tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(ExportOutputError, match="Permission denied"):
            await export_calls(store, locked / "calls.jsonl")
    finally:
        locked.chmod(0o700)


def test_check_store_file_refuses_what_is_not_a_store_without_creating_it(tmp_path: Path) -> None:
    with pytest.raises(NoStoreError, match="no store at"):
        check_store_file(tmp_path / "missing.db")
    assert not (tmp_path / "missing.db").exists()
    (tmp_path / "empty.db").touch()
    with pytest.raises(NoStoreError, match="empty file"):
        check_store_file(tmp_path / "empty.db")
    assert (tmp_path / "empty.db").stat().st_size == 0
    with pytest.raises(NoStoreError, match="is a directory"):
        check_store_file(tmp_path)


def test_record_from_json_refuses_unknown_kinds(make_call: Callable[..., LLMCall]) -> None:
    record = call_record(make_call())
    assert record_from_json(json.loads(json.dumps(record))) == make_call()
    with pytest.raises(ValueError, match="'llm_call' or 'reward'"):
        record_from_json({**record, "kind": "span"})
