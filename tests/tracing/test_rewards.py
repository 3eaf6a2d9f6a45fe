"""emit_reward: validation, rollout resolution, and in-process delivery to a store (ordering, threads)."""

from __future__ import annotations

import asyncio
import math
import threading
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from shared_helpers import collect
from tracing_helpers import CapturingSink

from agl_bridge import emit_reward, emit_reward_async, semconv
from agl_bridge.store import SQLiteStore
from agl_bridge.tracing import (
    NoRolloutError,
    RewardDeliveryError,
    StoreSink,
    rollout_context,
    set_reward_sink,
)
from agl_bridge.types import LLMCall, Reward


def call(rollout_id: str = "ro-1", attempt_id: str = "at-1") -> LLMCall:
    return LLMCall(rollout_id=rollout_id, attempt_id=attempt_id, model="tiny", prompt_token_ids=[1, 2])


# --- validation and resolution --------------------------------------------------------------------


@pytest.mark.parametrize("value", [True, False, math.nan, math.inf, -math.inf, "1.0", None, [1.0], 1j, Decimal("NaN")])
def test_bad_values_raise_value_error_naming_the_value(value: Any, capturing_sink: CapturingSink) -> None:
    with rollout_context("ro-1"):
        with pytest.raises(ValueError) as info:
            emit_reward(value)
    assert repr(value) in str(info.value) and "finite real number" in str(info.value)
    assert capturing_sink.records == []


@pytest.mark.parametrize("value", [0, 1, -2.5, np.float32(0.25), np.int64(3), Decimal("0.5")])
def test_real_numbers_are_recorded_as_floats(value: Any, capturing_sink: CapturingSink) -> None:
    with rollout_context("ro-1", "at-1"):
        emit_reward(value, name="score")
    (reward,) = capturing_sink.records
    assert isinstance(reward, Reward)
    assert (reward.rollout_id, reward.attempt_id, reward.name) == ("ro-1", "at-1", "score")
    assert reward.value == float(value) and type(reward.value) is float
    assert reward.span_id and len(reward.span_id) == 16 and reward.trace_id and len(reward.trace_id) == 32


def test_bad_name_is_refused(capturing_sink: CapturingSink) -> None:
    with rollout_context("ro-1"), pytest.raises(ValueError, match="name must be a non-empty string"):
        emit_reward(1.0, name="")


def test_no_rollout_is_an_error_that_lists_the_three_ways(capturing_sink: CapturingSink) -> None:
    with pytest.raises(NoRolloutError) as info:
        emit_reward(0.5)
    message = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert "emit_reward(0.5)" in message and "not recorded" in message
    assert "rollout_context(" in message
    assert semconv.ENV_ROLLOUT_ID in message and semconv.ENV_ENDPOINT in message
    assert "rollout_id=" in message
    assert capturing_sink.records == []


def test_precedence_is_arguments_then_context_then_env(
    monkeypatch: pytest.MonkeyPatch, capturing_sink: CapturingSink
) -> None:
    monkeypatch.setenv(semconv.ENV_ROLLOUT_ID, "ro-env")
    monkeypatch.setenv(semconv.ENV_ATTEMPT_ID, "at-env")
    emit_reward(1.0)
    with rollout_context("ro-ctx", "at-ctx"):
        emit_reward(2.0)
        emit_reward(3.0, rollout_id="ro-arg", attempt_id="at-arg")
        emit_reward(4.0, rollout_id="ro-arg")  # another rollout: the context's attempt does not apply
        emit_reward(5.0, rollout_id="ro-ctx")  # the same rollout: its current attempt is kept
    emit_reward(6.0, rollout_id="ro-env")
    got = [(r.value, r.rollout_id, r.attempt_id) for r in capturing_sink.records]
    assert got == [
        (1.0, "ro-env", "at-env"),
        (2.0, "ro-ctx", "at-ctx"),
        (3.0, "ro-arg", "at-arg"),
        (4.0, "ro-arg", None),
        (5.0, "ro-ctx", "at-ctx"),
        (6.0, "ro-env", "at-env"),
    ]


def test_attempt_without_rollout_is_refused(capturing_sink: CapturingSink) -> None:
    with rollout_context("ro-1"), pytest.raises(ValueError, match="without rollout_id"):
        emit_reward(1.0, attempt_id="at-1")


def test_rollout_without_endpoint_or_sink_is_a_delivery_error() -> None:
    with rollout_context("ro-1"), pytest.raises(RewardDeliveryError) as info:
        emit_reward(1.0)
    assert semconv.ENV_ENDPOINT in str(info.value) and "set_reward_sink" in str(info.value)


def test_reward_span_is_a_child_of_the_current_span(capturing_sink: CapturingSink) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("agent")
    with rollout_context("ro-1"), tracer.start_as_current_span("agent.run") as parent:
        emit_reward(1.0)
    (reward,) = capturing_sink.records
    assert reward.trace_id == format(parent.get_span_context().trace_id, "032x")


# --- in-process store sink ------------------------------------------------------------------------


async def test_rewards_get_sequences_between_the_calls_around_them(store: SQLiteStore) -> None:
    set_reward_sink(StoreSink(store, asyncio.get_running_loop()))
    with rollout_context("ro-1", "at-1"):
        first_call = await store.add_llm_call(call())
        await emit_reward_async(0.25, name="partial")
        allocated = await store.next_sequence("ro-1", "at-1")  # what the proxy does for a new call
        await asyncio.to_thread(emit_reward, 1.0)  # the sync call, from a worker thread
        last_call = await store.add_llm_call(call())
    rewards = await collect(store.iter_rewards("ro-1", "at-1"))
    assert [(r.name, r.value) for r in rewards] == [("partial", 0.25), ("reward", 1.0)]
    assert first_call < rewards[0].sequence < allocated < rewards[1].sequence < last_call


async def test_sync_emit_from_plain_threads_while_the_store_runs_in_the_loop(store: SQLiteStore) -> None:
    set_reward_sink(StoreSink(store, asyncio.get_running_loop()))
    errors: list[BaseException] = []

    def agent(index: int) -> None:
        try:
            for step in range(5):
                emit_reward(float(step), name=f"r{step}", rollout_id=f"ro-{index}", attempt_id="at-1")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    # The loop must keep running while the threads block on their writes.
    while any(thread.is_alive() for thread in threads):
        await asyncio.sleep(0.01)
    assert errors == []
    for index in range(8):
        rewards = await collect(store.iter_rewards(f"ro-{index}", "at-1"))
        assert [r.value for r in rewards] == [0.0, 1.0, 2.0, 3.0, 4.0]  # emission order = sequence order
        assert len({r.sequence for r in rewards}) == 5


async def test_sync_emit_inside_the_store_loop_points_to_the_async_version(store: SQLiteStore) -> None:
    set_reward_sink(StoreSink(store, asyncio.get_running_loop()))
    with rollout_context("ro-1"), pytest.raises(RewardDeliveryError) as info:
        emit_reward(1.0)
    assert "emit_reward_async" in str(info.value) and "deadlock" in str(info.value)
    assert await collect(store.iter_rewards()) == []


async def test_store_sink_on_a_loop_in_another_thread(store: SQLiteStore, tmp_path: Any) -> None:
    # The proxy's loop runs in a background thread; the agent's own loop awaits emit_reward_async.
    ready = threading.Event()
    box: dict[str, Any] = {}

    def serve() -> None:
        async def main() -> None:
            async with SQLiteStore(tmp_path / "other.db") as other:
                box["store"], box["loop"], box["stop"] = other, asyncio.get_running_loop(), asyncio.Event()
                ready.set()
                await box["stop"].wait()

        asyncio.run(main())

    thread = threading.Thread(target=serve)
    thread.start()
    ready.wait(10)
    try:
        set_reward_sink(StoreSink(box["store"], box["loop"]))
        with rollout_context("ro-x", "at-x"):
            await emit_reward_async(0.5)
            await asyncio.to_thread(emit_reward, 0.75)
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(10)
    async with SQLiteStore(tmp_path / "other.db") as reader:
        assert [r.value for r in await collect(reader.iter_rewards("ro-x", "at-x"))] == [0.5, 0.75]


async def test_a_reward_commits_while_the_loop_that_opened_the_store_is_busy(store: SQLiteStore) -> None:
    # The proxy's loop, busy serving other agents' requests on a loaded machine, is blocked outright
    # here: an agent's reward must be committed by the store's writer without waiting for that loop.
    set_reward_sink(StoreSink(store, asyncio.get_running_loop(), timeout_s=5.0))
    errors: list[BaseException] = []

    def agent() -> None:
        async def async_agent() -> None:
            await emit_reward_async(0.5, name="partial")

        try:
            with rollout_context("ro-busy", "at-1"):
                asyncio.run(async_agent())  # an async agent on a loop of its own
                emit_reward(1.0)  # a sync agent in a plain thread
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=agent)
    thread.start()
    thread.join(60)  # blocks this loop (the store's) on purpose; 60 s only bounds a hang
    assert not thread.is_alive() and errors == []
    rewards = await collect(store.iter_rewards("ro-busy", "at-1"))
    assert [(r.name, r.value) for r in rewards] == [("partial", 0.5), ("reward", 1.0)]


async def test_a_sync_reward_leaves_the_threads_own_event_loop_alone(store: SQLiteStore) -> None:
    set_reward_sink(StoreSink(store, asyncio.get_running_loop()))

    def sync_program() -> bool:
        own = asyncio.new_event_loop()
        asyncio.set_event_loop(own)  # a sync program that keeps a loop for later
        try:
            emit_reward(1.0, rollout_id="ro-own", attempt_id="at-1")
            return asyncio.get_event_loop() is own
        finally:
            asyncio.set_event_loop(None)
            own.close()

    assert await asyncio.to_thread(sync_program)
    assert [r.value for r in await collect(store.iter_rewards("ro-own"))] == [1.0]


async def test_store_failure_is_a_delivery_error(tmp_path: Any) -> None:
    closed = SQLiteStore(tmp_path / "closed.db")  # never opened
    set_reward_sink(StoreSink(closed, asyncio.get_running_loop()))
    with rollout_context("ro-1"), pytest.raises(RewardDeliveryError, match="not open"):
        await emit_reward_async(1.0)


def test_store_sink_with_a_stopped_loop_is_a_delivery_error(tmp_path: Any) -> None:
    loop = asyncio.new_event_loop()
    try:
        set_reward_sink(StoreSink(SQLiteStore(tmp_path / "s.db"), loop))
        with rollout_context("ro-1"), pytest.raises(RewardDeliveryError, match="not running"):
            emit_reward(1.0)
    finally:
        loop.close()


def test_set_reward_sink_returns_the_previous_one_and_checks_its_argument() -> None:
    first, second = CapturingSink(), CapturingSink()
    assert set_reward_sink(first) is None
    assert set_reward_sink(second) is first
    assert set_reward_sink(None) is second
    with pytest.raises(TypeError, match="deliver"):
        set_reward_sink(object())  # type: ignore[arg-type]
