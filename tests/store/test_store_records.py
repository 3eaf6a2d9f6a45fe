"""LLM calls and rewards: exact round-trips, sequence assignment, dedupe, and ordered streaming."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from shared_helpers import collect, float_bits

from agl_bridge.store import DuplicateRecordError, SQLiteStore, Store, StoreClosedError
from agl_bridge.types import LLMCall, Reward, Usage

TRICKY_LOGPROBS = [
    -0.0,
    0.0,
    -1e-300,
    -5e-324,  # smallest subnormal
    -0.1,
    -1 / 3,
    -math.pi,
    -1.7976931348623157e308,
    -math.inf,
    -2.220446049250313e-16,
]


def test_sqlite_store_implements_the_store_protocol(tmp_path: Path) -> None:
    assert isinstance(SQLiteStore(tmp_path / "s.db"), Store)


async def test_llm_call_round_trips_every_field_exactly(store: SQLiteStore) -> None:
    call = LLMCall(
        rollout_id="ro-1",
        attempt_id="at-1",
        model="tiny",
        prompt_token_ids=[0, 1, 2**31 - 1, 151_643],
        response_token_ids=list(range(len(TRICKY_LOGPROBS))),
        response_logprobs=TRICKY_LOGPROBS,
        token_policy_versions=[3] * 5 + [4] * 5,
        messages=[{"role": "user", "content": "héllo ✓ \u0000"}, {"role": "assistant", "content": None}],
        response_text="answer",
        finish_reason="length",
        agent_name="solver",
        started_at=1.5,
        ended_at=2.25,
        choice_index=1,
        prefix_breaks=[{"turn": 2, "reason": "template dropped <think>"}],
        span_id="00f067aa0ba902b7",
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
        usage=Usage(input_tokens=4, output_tokens=10),
    )
    sequence = await store.add_llm_call(call)
    [stored] = await collect(store.iter_llm_calls("ro-1", "at-1"))
    assert float_bits(stored.response_logprobs) == float_bits(TRICKY_LOGPROBS)
    assert stored.policy_version == 3
    call.sequence = sequence
    assert stored == call


async def test_text_call_and_reward_round_trip(store: SQLiteStore) -> None:
    text_call = LLMCall(rollout_id="ro-1", attempt_id="at-1", model="gpt-x", kind="text", response_text="hi")
    await store.add_llm_call(text_call)
    reward = Reward(rollout_id="ro-1", attempt_id="at-1", value=0.75, name="accuracy", timestamp=10.0, span_id="s1")
    await store.add_reward(reward)
    [stored_call] = await collect(store.iter_llm_calls("ro-1"))
    [stored_reward] = await collect(store.iter_rewards("ro-1"))
    assert stored_call.kind == "text" and stored_call.prompt_token_ids == [] and stored_call.response_text == "hi"
    assert (stored_reward.name, stored_reward.value, stored_reward.timestamp) == ("accuracy", 0.75, 10.0)


async def test_calls_and_rewards_share_one_sequence_space_per_attempt(
    store: SQLiteStore, make_call: Callable[..., LLMCall]
) -> None:
    first = await store.add_llm_call(make_call())
    reward = await store.add_reward(Reward(rollout_id="ro-1", attempt_id="at-1", value=1.0))
    second = await store.add_llm_call(make_call())
    other_attempt = await store.add_llm_call(make_call(attempt_id="at-2"))
    assert (first, reward, second) == (0, 1, 2)
    assert other_attempt == 0


async def test_explicit_sequence_is_kept_and_raises_the_counter(
    store: SQLiteStore, make_call: Callable[..., LLMCall]
) -> None:
    assert await store.add_llm_call(make_call(sequence=41)) == 41
    assert await store.next_sequence("ro-1", "at-1") == 42
    assert await store.add_llm_call(make_call()) == 43


async def test_redelivered_span_is_stored_once(store: SQLiteStore, make_call: Callable[..., LLMCall]) -> None:
    call = make_call(span_id="abc", sequence=await store.next_sequence("ro-1", "at-1"))
    assert await store.add_llm_call(call) == 0
    assert await store.add_llm_call(call) == 0
    reward = Reward(rollout_id="ro-1", attempt_id="at-1", value=1.0, span_id="r1")
    first = await store.add_reward(reward)
    assert await store.add_reward(reward) == first
    assert len(await collect(store.iter_llm_calls())) == 1
    assert len(await collect(store.iter_rewards())) == 1


async def test_taken_sequence_slot_fails_only_its_own_record(
    store: SQLiteStore, make_call: Callable[..., LLMCall]
) -> None:
    await store.add_llm_call(make_call(sequence=5, span_id="a"))
    with pytest.raises(DuplicateRecordError, match="sequence 5"):
        await store.add_llm_calls(
            [make_call(sequence=6, span_id="b"), make_call(sequence=5, span_id="c"), make_call(span_id="d")]
        )
    stored = [(c.sequence, c.span_id) for c in await collect(store.iter_llm_calls("ro-1"))]
    assert stored == [(5, "a"), (6, "b"), (7, "d")]


async def test_choices_of_one_request_share_a_sequence(store: SQLiteStore, make_call: Callable[..., LLMCall]) -> None:
    sequence = await store.next_sequence("ro-1", "at-1")
    await store.add_llm_calls([make_call(sequence=sequence, choice_index=i) for i in (1, 0)])
    assert [(c.sequence, c.choice_index) for c in await collect(store.iter_llm_calls("ro-1"))] == [(0, 0), (0, 1)]


async def test_streams_in_sequence_order_across_pages(tmp_path: Path, make_call: Callable[..., LLMCall]) -> None:
    expected = [(r, a, seq) for r in ("ro-a", "ro-b") for a in ("at-1", "at-2") for seq in range(7)]
    shuffled = expected[:]
    random.Random(0).shuffle(shuffled)
    async with SQLiteStore(tmp_path / "s.db", read_page_size=3) as store:
        await store.add_llm_calls([make_call(rollout_id=r, attempt_id=a, sequence=s) for r, a, s in shuffled])
        await store.add_rewards([Reward(rollout_id=r, attempt_id=a, sequence=100 + s, value=s) for r, a, s in shuffled])
        calls = await collect(store.iter_llm_calls())
        assert [(c.rollout_id, c.attempt_id, c.sequence) for c in calls] == expected
        one_rollout = await collect(store.iter_llm_calls("ro-b"))
        assert [(c.attempt_id, c.sequence) for c in one_rollout] == [(a, s) for r, a, s in expected if r == "ro-b"]
        one_attempt = await collect(store.iter_rewards("ro-a", "at-2"))
        assert [r.sequence for r in one_attempt] == [100 + s for s in range(7)]


async def test_stream_pages_lazily_and_sees_rows_added_while_walking(
    tmp_path: Path, make_call: Callable[..., LLMCall]
) -> None:
    async with SQLiteStore(tmp_path / "s.db", read_page_size=2) as store:
        await store.add_llm_calls([make_call(sequence=s) for s in range(3)])
        iterator = store.iter_llm_calls("ro-1")
        first = await anext(iterator)
        await store.add_llm_call(make_call(sequence=3))  # after the cursor: must still appear
        rest = [c.sequence async for c in iterator]
        assert [first.sequence, *rest] == [0, 1, 2, 3]


async def test_calls_outside_rollouts_have_their_own_space_and_show_only_in_exports(
    store: SQLiteStore, make_call: Callable[..., LLMCall]
) -> None:
    assert await store.next_sequence(None, None) == 0
    loose = await store.add_llm_call(make_call(rollout_id=None, attempt_id=None))
    await store.add_llm_call(make_call())
    await store.add_reward(Reward(value=2.0))
    assert loose == 1
    assert [c.rollout_id for c in await collect(store.iter_llm_calls())] == ["ro-1"]
    assert [c.rollout_id for c in await collect(store.iter_all_calls())] == [None, "ro-1"]
    assert [r.rollout_id for r in await collect(store.iter_all_rewards())] == [None]
    assert await collect(store.iter_rewards()) == []


async def test_bad_records_fail_their_caller_before_reaching_the_batch(
    store: SQLiteStore, make_call: Callable[..., LLMCall]
) -> None:
    with pytest.raises(ValueError, match="prompt_token_ids must be a list of integers in the int32 range"):
        await store.add_llm_call(make_call(prompt_token_ids=[2**31]))
    with pytest.raises(ValueError, match="messages must be JSON-serializable"):
        await store.add_llm_call(make_call(messages=[{"role": "user", "content": object()}]))
    with pytest.raises(TypeError, match="expected an LLMCall"):
        await store.add_llm_call({"model": "x"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="attempt_id 'at-1' was given without its rollout_id"):
        await collect(store.iter_llm_calls(None, "at-1"))
    assert await collect(store.iter_all_calls()) == []


async def test_using_a_store_that_is_not_open_says_so(tmp_path: Path, make_call: Callable[..., LLMCall]) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    with pytest.raises(StoreClosedError, match="not open"):
        await store.add_llm_call(make_call())
    async with store:
        pass
    with pytest.raises(StoreClosedError, match="not open"):
        await store.next_sequence("ro-1", "at-1")
    with pytest.raises(StoreClosedError, match="not open"):
        await store.get_rollout("ro-1")
