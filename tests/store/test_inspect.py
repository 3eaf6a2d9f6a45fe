"""Store summaries for `agl-bridge inspect`: the overview, one rollout's detail, and their rendering."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from rich.console import Console, RenderableType

from agl_bridge.store import RolloutNotFoundError, SQLiteStore
from agl_bridge.store.inspect import (
    PREVIEW_CHARS,
    CallLine,
    RewardLine,
    render_overview,
    render_rollout_detail,
    rollout_detail,
    store_overview,
)
from agl_bridge.types import AttemptStatus, LLMCall, Reward, RolloutStatus


@dataclass
class Sample:
    """Ids of what `build` put in the store."""

    first_attempt: str
    second_attempt: str


async def build(store: SQLiteStore, make_call: Callable[..., LLMCall]) -> Sample:
    """ro-1: two attempts (the first failed) and a rollout-level call; ro-2: queued, empty; ro-3: calls only;
    two calls and a reward outside any rollout; ext-1: records only (registered by its first call)."""
    await store.create_rollout({"question": "2+2"}, group_id="g-a", rollout_id="ro-1")
    await store.create_rollout({"question": "idle"}, rollout_id="ro-2")
    await store.create_rollout({"question": "3+3"}, group_id="g-a", rollout_id="ro-3")
    first = await store.start_attempt("ro-1")
    await store.add_llm_call(make_call(rollout_id="ro-1", attempt_id=first.attempt_id, finish_reason="length"))
    await store.add_reward(Reward(rollout_id="ro-1", attempt_id=first.attempt_id, value=0.25, name="partial"))
    await store.finish_attempt(first.attempt_id, AttemptStatus.FAILED, error="boom")
    second = await store.start_attempt("ro-1")
    await store.add_llm_call(make_call(rollout_id="ro-1", attempt_id=second.attempt_id, response_text="x" * 100))
    await store.add_reward(Reward(rollout_id="ro-1", attempt_id=second.attempt_id, value=0.5))
    await store.add_llm_call(
        make_call(
            rollout_id="ro-1",
            attempt_id=second.attempt_id,
            prompt_token_ids=list(range(10)),
            response_token_ids=[1, 2, 3],
            response_logprobs=[-0.5, -0.25, -0.125],
            token_policy_versions=[5, 5, 6],
            prefix_breaks=[{"turn": 1}, {"turn": 2}],
            response_text="[bold]not markup[/bold]\nsecond line",
        )
    )
    await store.add_reward(Reward(rollout_id="ro-1", attempt_id=second.attempt_id, value=0.125, name="bonus"))
    await store.finish_attempt(second.attempt_id, AttemptStatus.SUCCEEDED)
    await store.set_rollout_status("ro-1", RolloutStatus.SUCCEEDED)
    await store.add_llm_call(make_call(rollout_id="ro-1", attempt_id=None, model="judge"))
    third = await store.start_attempt("ro-3")
    for _ in range(2):
        await store.add_llm_call(make_call(rollout_id="ro-3", attempt_id=third.attempt_id))
    for _ in range(2):
        await store.add_llm_call(make_call(rollout_id=None, attempt_id=None))
    await store.add_reward(Reward(value=3.0))
    await store.add_llm_call(make_call(rollout_id="ext-1", attempt_id="ext-at", kind="text", prompt_token_ids=[],
                                       response_token_ids=[], response_logprobs=[]))  # fmt: skip
    return Sample(first_attempt=first.attempt_id, second_attempt=second.attempt_id)


def text_of(renderable: RenderableType) -> str:
    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(renderable)
    return console.export_text()


async def test_overview_counts_every_rollout_and_the_records_outside_rollouts(
    store: SQLiteStore, make_call: Callable[..., LLMCall]
) -> None:
    await build(store, make_call)
    overview = await store_overview(store, name="s.db")
    rows = {row.rollout_id: row for row in overview.rollouts}
    assert [row.rollout_id for row in overview.rollouts] == ["ro-1", "ro-2", "ro-3", "ext-1"]  # creation order
    ext = rows["ext-1"]  # nothing recorded is invisible: its first call registered it
    assert (ext.status, ext.origin, ext.attempts, ext.calls, ext.group_id) == ("running", "external", 1, 1, None)
    ro1 = rows["ro-1"]
    assert (ro1.status, ro1.group_id, ro1.attempts, ro1.calls, ro1.rewards) == ("succeeded", "g-a", 2, 4, 3)
    assert ro1.reward_sum == 0.875
    assert (rows["ro-2"].status, rows["ro-2"].calls, rows["ro-2"].rewards, rows["ro-2"].reward_sum) == (
        "queued", 0, 0, None,
    )  # fmt: skip
    assert (rows["ro-3"].calls, rows["ro-3"].rewards, rows["ro-3"].reward_sum) == (2, 0, None)  # no reward ≠ zero
    assert (overview.calls_without_rollout, overview.rewards_without_rollout) == (2, 1)
    assert overview.more_rollouts is False
    document = json.loads(json.dumps(overview.to_json()))
    assert document["store"] == "s.db" and document["calls_without_rollout"] == 2
    assert document["rollouts"][0] == {
        "rollout_id": "ro-1", "status": "succeeded", "group_id": "g-a", "attempts": 2, "calls": 4, "rewards": 3,
        "reward_sum": 0.875, "created_at": ro1.created_at, "origin": "runner", "eval": False,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("limit", "shown", "more"), [(1, ["ro-1"], True), (2, ["ro-1", "ro-2"], True), (4, None, False)]
)
async def test_overview_limit_cuts_the_listing_and_says_so(
    store: SQLiteStore, make_call: Callable[..., LLMCall], limit: int, shown: list[str] | None, more: bool
) -> None:
    await build(store, make_call)
    overview = await store_overview(store, limit=limit)
    assert [row.rollout_id for row in overview.rollouts] == (shown or ["ro-1", "ro-2", "ro-3", "ext-1"])
    assert overview.more_rollouts is more
    assert ("more rollouts exist" in text_of(render_overview(overview))) is more


async def test_overview_of_an_empty_store(store: SQLiteStore) -> None:
    overview = await store_overview(store)
    assert (overview.rollouts, overview.calls_without_rollout, overview.rewards_without_rollout) == ([], 0, 0)
    assert "0 rollouts shown; 0 calls and 0 rewards without a rollout" in text_of(render_overview(overview))


async def test_detail_lists_attempts_with_calls_and_rewards_in_sequence_order(
    store: SQLiteStore, make_call: Callable[..., LLMCall]
) -> None:
    sample = await build(store, make_call)
    detail = await rollout_detail(store, "ro-1")
    assert detail.task == {"question": "2+2"}
    assert detail.rollout is not None and (detail.rollout.calls, detail.rollout.rewards) == (4, 3)
    assert detail.rollout.reward_sum == 0.875
    assert [a.attempt_id for a in detail.attempts] == [None, sample.first_attempt, sample.second_attempt]
    outside, first, second = detail.attempts
    assert [type(r) for r in outside.records] == [CallLine]
    assert isinstance(outside.records[0], CallLine) and outside.records[0].model == "judge"
    assert (first.number, first.status, first.error, first.calls, first.rewards) == (1, "failed", "boom", 1, 1)
    assert [type(r) for r in first.records] == [CallLine, RewardLine]
    assert (second.number, second.status, second.calls, second.rewards) == (2, "succeeded", 2, 2)
    assert second.reward_sum == 0.625
    assert [(type(r), r.sequence) for r in second.records] == [
        (CallLine, 0), (RewardLine, 1), (CallLine, 2), (RewardLine, 3),
    ]  # fmt: skip
    long_call, reward, rich_call, bonus = second.records
    assert isinstance(long_call, CallLine) and long_call.response_preview == "x" * PREVIEW_CHARS
    assert (long_call.prompt_tokens, long_call.response_tokens, long_call.prefix_breaks) == (3, 2, 0)
    assert isinstance(rich_call, CallLine)
    assert (rich_call.prompt_tokens, rich_call.response_tokens, rich_call.policy_version, rich_call.prefix_breaks) == (
        10, 3, 5, 2,
    )  # fmt: skip
    assert reward == RewardLine(sequence=1, name="reward", value=0.5)
    assert bonus == RewardLine(sequence=3, name="bonus", value=0.125)
    document: dict[str, Any] = json.loads(json.dumps(detail.to_json()))
    assert [r["kind"] for r in document["attempts"][2]["records"]] == ["llm_call", "reward", "llm_call", "reward"]
    assert document["attempts"][2]["records"][2]["response_preview"] == "[bold]not markup[/bold]\nsecond line"


async def test_detail_limit_cuts_records_but_not_counts(store: SQLiteStore, make_call: Callable[..., LLMCall]) -> None:
    await build(store, make_call)
    detail = await rollout_detail(store, "ro-1", limit=2)
    second = detail.attempts[2]
    assert [r.sequence for r in second.records] == [0, 1] and second.truncated
    assert (second.calls, second.rewards, second.reward_sum) == (2, 2, 0.625)
    assert not detail.attempts[1].truncated
    assert "only the first 2 records are listed" in text_of(render_rollout_detail(detail))


async def test_detail_of_a_rollout_without_attempts(store: SQLiteStore, make_call: Callable[..., LLMCall]) -> None:
    await build(store, make_call)
    detail = await rollout_detail(store, "ro-2")
    assert detail.attempts == [] and detail.rollout is not None and detail.rollout.status == "queued"
    assert "no attempts and no records yet" in text_of(render_rollout_detail(detail))


async def test_detail_of_a_rollout_known_only_from_its_records(
    store: SQLiteStore, make_call: Callable[..., LLMCall]
) -> None:
    await build(store, make_call)
    detail = await rollout_detail(store, "ext-1")
    assert detail.rollout is not None and detail.rollout.origin == "external" and detail.task is None
    (attempt,) = detail.attempts
    assert (attempt.attempt_id, attempt.number, attempt.status, attempt.calls) == ("ext-at", 1, "running", 1)
    assert isinstance(attempt.records[0], CallLine) and attempt.records[0].call_kind == "text"
    text = text_of(render_rollout_detail(detail))
    assert "running, started by external" in text and "text call" in text


async def test_unknown_rollout_is_an_error(store: SQLiteStore, make_call: Callable[..., LLMCall]) -> None:
    await build(store, make_call)
    with pytest.raises(RolloutNotFoundError) as info:
        await rollout_detail(store, "ro-nope")
    assert info.value.rollout_id == "ro-nope"


async def test_rendering_shows_text_literally_on_one_line(
    store: SQLiteStore, make_call: Callable[..., LLMCall]
) -> None:
    sample = await build(store, make_call)
    text = text_of(render_rollout_detail(await rollout_detail(store, "ro-1")))
    assert "[bold]not markup[/bold]\\nsecond line" in text  # markup not interpreted, newline escaped
    assert f"attempt 1 {sample.first_attempt}: failed" in text and "error: boom" in text
    assert "records outside any attempt" in text
    assert "2 calls, 2 rewards, reward sum 0.625" in text
    assert "x" * PREVIEW_CHARS in text and "x" * (PREVIEW_CHARS + 1) not in text
    overview_text = text_of(render_overview(await store_overview(store, name="s.db")))
    assert "ro-1" in overview_text and "0.875" in overview_text and "succeeded" in overview_text
    assert "4 rollouts shown; 2 calls and 1 reward without a rollout" in overview_text
    assert "external" in overview_text and "runner" in overview_text
