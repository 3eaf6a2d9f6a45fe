"""Generic spans in the store: round trip, shared sequences, dedupe by span id, streams, validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from shared_helpers import collect

from agl_bridge.store import SQLiteStore, Store
from agl_bridge.types import LLMCall, Reward, StoredSpan

_counter = iter(range(1, 1_000_000))


def span(**overrides: Any) -> StoredSpan:
    number = next(_counter)
    fields: dict[str, Any] = {
        "rollout_id": "ro-1",
        "attempt_id": "at-1",
        "name": "tool.call",
        "trace_id": f"{number:032x}",
        "span_id": f"{number:016x}",
        "start_time_ns": 1_700_000_000_000_000_000,
        "end_time_ns": 1_700_000_000_500_000_000,
    }
    fields.update(overrides)
    return StoredSpan(**fields)


def test_sqlite_store_still_implements_the_protocol(tmp_path: Path) -> None:
    assert isinstance(SQLiteStore(tmp_path / "s.db"), Store)


async def test_span_round_trips_every_field(store: SQLiteStore) -> None:
    original = span(
        parent_span_id="00f067aa0ba902b7",
        kind="client",
        attributes={"input.value": "héllo ✓", "n": 2**62, "tags": ["a"], "nested": {"ok": True}, "none": None},
        resource={"service.name": "agent"},
        scope_name="openinference.instrumentation.crewai",
        status="error",
        status_message="boom",
        end_time_ns=2**63 - 1,
    )
    sequence = await store.add_span(original)
    (stored,) = await collect(store.iter_spans("ro-1", "at-1"))
    original.sequence = sequence
    assert stored == original


async def test_spans_share_the_sequence_space_of_calls_and_rewards(store: SQLiteStore) -> None:
    call = LLMCall(rollout_id="ro-1", attempt_id="at-1", model="m", prompt_token_ids=[1])
    first = await store.add_llm_call(call)
    spans = await store.add_spans([span(), span()])
    reward = await store.add_reward(Reward(rollout_id="ro-1", attempt_id="at-1", value=1.0))
    assert first < spans[0] < spans[1] < reward
    assert [s.sequence for s in await collect(store.iter_spans("ro-1", "at-1"))] == spans


async def test_redelivered_span_is_stored_once_with_its_first_sequence(store: SQLiteStore) -> None:
    original = span()
    first = await store.add_span(original)
    again = await store.add_span(span(span_id=original.span_id, name="changed"))
    assert again == first
    assert [s.name for s in await collect(store.iter_all_spans())] == ["tool.call"]


async def test_streams_filter_and_order_like_the_other_records(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "s.db", read_page_size=2) as store:  # several pages
        await store.add_spans([span(rollout_id="ro-2", attempt_id=None) for _ in range(3)])
        await store.add_spans([span(attempt_id="at-2") for _ in range(3)])
        await store.add_spans([span() for _ in range(3)])
        await store.add_spans([span(rollout_id=None, attempt_id=None, name="outside")])
        by_rollout = await collect(store.iter_spans("ro-1"))
        assert [(s.attempt_id, s.sequence) for s in by_rollout] == [("at-1", i) for i in range(3)] + [
            ("at-2", i) for i in range(3)
        ]
        assert len(await collect(store.iter_spans("ro-1", "at-2"))) == 3
        attributed = await collect(store.iter_spans())
        assert len(attributed) == 9 and all(s.rollout_id for s in attributed)
        everything = await collect(store.iter_all_spans())
        assert everything[0].name == "outside" and len(everything) == 10
        with pytest.raises(ValueError, match="without its rollout_id"):
            await collect(store.iter_spans(None, "at-1"))


async def test_add_span_rejects_other_records(store: SQLiteStore) -> None:
    with pytest.raises(TypeError, match="StoredSpan"):
        await store.add_span(Reward(value=1.0))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"trace_id": "ABCDEF" + "0" * 26}, "trace_id must be 32 lower-case hex digits"),
        ({"trace_id": "0" * 32}, "not all zero"),
        ({"span_id": "12345"}, "span_id must be 16 lower-case hex digits"),
        ({"parent_span_id": "xyz"}, "parent_span_id must be 16"),
        ({"kind": "weird"}, "span kind must be one of"),
        ({"status": "failed"}, "span status must be one of"),
        ({"start_time_ns": -1}, "start_time_ns must be an integer number of nanoseconds"),
        ({"end_time_ns": 2**63}, "end_time_ns must be"),
        ({"attributes": []}, "must be dicts"),
        ({"rollout_id": None, "attempt_id": "at-1"}, "without a rollout_id"),
        ({"name": None}, "span name must be a string"),
    ],
)
def test_stored_span_validation(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        span(**overrides)


async def test_unserializable_attributes_fail_their_own_caller(store: SQLiteStore) -> None:
    with pytest.raises(ValueError, match="span attributes must be JSON-serializable"):
        await store.add_span(span(attributes={"x": float("nan")}))
    assert await collect(store.iter_all_spans()) == []
