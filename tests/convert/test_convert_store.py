"""`convert_store` over a real SQLite store: which attempts train, the report, order, filters, streaming."""

from __future__ import annotations

import gc
from array import array
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agl_bridge.convert import ConversionReport, ConvertOptions, DropReason, MissingRewardError, convert_store
from agl_bridge.store import RolloutNotFoundError, SQLiteStore
from agl_bridge.types import AttemptStatus, LLMCall, Reward, RolloutStatus


def token_call(rollout_id: str, attempt_id: str | None, prompt: list[int], response: list[int], **kw: Any) -> LLMCall:
    return LLMCall(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        model="tiny",
        prompt_token_ids=prompt,
        response_token_ids=response,
        response_logprobs=[-0.5] * len(response),
        token_policy_versions=[1] * len(response),
        messages=[{"role": "user", "content": "hi"}],
        **kw,
    )


async def finish(store: SQLiteStore, rollout_id: str, attempt_id: str, status: AttemptStatus) -> None:
    await store.finish_attempt(attempt_id, status)
    await store.set_rollout_status(rollout_id, RolloutStatus(status.value))


async def conversation(store: SQLiteStore, rollout_id: str, attempt_id: str, reward: float | None = 1.0) -> None:
    """Two extending calls, then (optionally) a reward."""
    await store.add_llm_call(token_call(rollout_id, attempt_id, [1, 2], [3]))
    await store.add_llm_call(token_call(rollout_id, attempt_id, [1, 2, 3, 4], [5]))
    if reward is not None:
        await store.add_reward(Reward(rollout_id=rollout_id, attempt_id=attempt_id, value=reward))


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    """One rollout per case, ids in alphabetical order of the cases."""
    async with SQLiteStore(tmp_path / "store.db", read_page_size=2) as opened:
        # a: attempt 1 failed, attempt 2 succeeded; a rollout-level reward; stray records.
        await opened.create_rollout({"q": "a"}, group_id="g-1", rollout_id="a-retried")
        first = await opened.start_attempt("a-retried")
        await opened.add_llm_call(token_call("a-retried", first.attempt_id, [9], [9]))
        await opened.finish_attempt(first.attempt_id, AttemptStatus.FAILED)
        await opened.set_rollout_status("a-retried", RolloutStatus.QUEUED)
        second = await opened.start_attempt("a-retried")
        await conversation(opened, "a-retried", second.attempt_id, reward=0.5)
        await opened.add_llm_call(token_call("a-retried", None, [7], [7]))  # outside any attempt
        await opened.add_reward(Reward(rollout_id="a-retried", value=0.25, name="verifier"))  # rollout-level
        await opened.add_reward(Reward(rollout_id="a-retried", attempt_id="at-unknown", value=9.0))
        await finish(opened, "a-retried", second.attempt_id, AttemptStatus.SUCCEEDED)
        # b: attempt succeeded but the rollout is still running.
        await opened.create_rollout({"q": "b"}, group_id="g-1", rollout_id="b-running")
        attempt = await opened.start_attempt("b-running")
        await conversation(opened, "b-running", attempt.attempt_id)
        await opened.finish_attempt(attempt.attempt_id, AttemptStatus.SUCCEEDED)
        # c: attempt succeeded, yet the runner marked the rollout failed.
        await opened.create_rollout({"q": "c"}, rollout_id="c-verdict")
        attempt = await opened.start_attempt("c-verdict")
        await conversation(opened, "c-verdict", attempt.attempt_id)
        await opened.finish_attempt(attempt.attempt_id, AttemptStatus.SUCCEEDED)
        await opened.set_rollout_status("c-verdict", RolloutStatus.FAILED)
        # d: timed out.
        await opened.create_rollout({"q": "d"}, rollout_id="d-timeout")
        attempt = await opened.start_attempt("d-timeout")
        await conversation(opened, "d-timeout", attempt.attempt_id)
        await finish(opened, "d-timeout", attempt.attempt_id, AttemptStatus.TIMED_OUT)
        # e: succeeded without a reward.
        await opened.create_rollout({"q": "e"}, group_id="g-2", rollout_id="e-no-reward")
        attempt = await opened.start_attempt("e-no-reward")
        await conversation(opened, "e-no-reward", attempt.attempt_id, reward=None)
        await finish(opened, "e-no-reward", attempt.attempt_id, AttemptStatus.SUCCEEDED)
        # f: text calls only.
        await opened.create_rollout({"q": "f"}, rollout_id="f-text")
        attempt = await opened.start_attempt("f-text")
        text = LLMCall(rollout_id="f-text", attempt_id=attempt.attempt_id, model="remote", kind="text")
        await opened.add_llm_call(text)
        await opened.add_reward(Reward(rollout_id="f-text", attempt_id=attempt.attempt_id, value=1.0))
        await finish(opened, "f-text", attempt.attempt_id, AttemptStatus.SUCCEEDED)
        # g: queued, never started. Plus records of a rollout the store had no row for: they registered it
        # (external, running: never trained until someone finishes it).
        await opened.create_rollout({"q": "g"}, rollout_id="g-queued")
        await opened.add_llm_call(token_call("ghost", "at-ghost", [1], [2]))
        await opened.add_reward(Reward(rollout_id="ghost", attempt_id="at-ghost", value=1.0))
        yield opened


async def collect(store: SQLiteStore, **kwargs: Any) -> tuple[list, ConversionReport]:
    report = ConversionReport()
    trajectories = [t async for t in convert_store(store, report=report, **kwargs)]
    return trajectories, report


async def test_only_succeeded_attempts_of_finished_rollouts_train(store: SQLiteStore) -> None:
    trajectories, report = await collect(store)
    assert [t.rollout_id for t in trajectories] == ["a-retried"]
    (trajectory,) = trajectories
    attempts = await store.list_attempts("a-retried")
    assert trajectory.attempt_id == attempts[1].attempt_id
    assert (trajectory.group_id, trajectory.task) == ("g-1", {"q": "a"})
    (segment,) = trajectory.segments
    assert segment.input_ids == [1, 2, 3, 4, 5] and segment.loss_mask == [0, 0, 1, 0, 1]
    # The rollout-level reward joins the last attempt, attached to no call.
    assert trajectory.rewards == {"reward": 0.5, "verifier": 0.25} and trajectory.reward == 0.75
    assert trajectory.unattached_rewards == {"verifier": 0.25}
    assert segment.calls[-1].rewards == {"reward": 0.5}


async def test_the_report_counts_every_attempt_call_and_reward(store: SQLiteStore) -> None:
    _, report = await collect(store)
    assert report.to_json() == {
        "rollouts_seen": 8,
        "attempts_seen": 8,
        "attempts_converted": 1,
        "attempts_dropped": 7,
        "dropped": {"failed": 2, "not_finished": 2, "timed_out": 1, "missing_reward": 1, "no_trainable_calls": 1},
        "segments": 1,
        "splits": {},
        "calls_seen": 14,
        "calls_trained": 2,
        "calls_not_trained": {"dropped_attempt": 11, "outside_attempt": 1},
        "rewards_seen": 8,
        "rewards_ignored": 1,
        "missing_reward_zeroed": 0,
        "calls_by_class": {"main": 2},
        "trained_tokens_by_class": {"main": report.trained_tokens},
        "excluded_by_class": {},
        "trained_tokens": report.trained_tokens,
        "trained_sampled_tokens": report.trained_tokens,
        "sampled_share": 1.0,
        "graph_warnings": 0,
    }
    assert report.trained_tokens > 0


async def test_missing_reward_zero_and_error_through_the_store(store: SQLiteStore) -> None:
    trajectories, report = await collect(store, options=ConvertOptions(missing_reward="zero"))
    assert [t.rollout_id for t in trajectories] == ["a-retried", "e-no-reward"]
    assert trajectories[1].missing_reward and trajectories[1].reward == 0.0
    assert report.missing_reward_zeroed == 1 and DropReason.MISSING_REWARD.value not in report.dropped
    with pytest.raises(MissingRewardError, match="'e-no-reward'"):
        await collect(store, options=ConvertOptions(missing_reward="error"))


async def test_rollout_ids_are_converted_in_the_order_given(store: SQLiteStore) -> None:
    trajectories, report = await collect(
        store, rollout_ids=["e-no-reward", "a-retried", "e-no-reward"], options=ConvertOptions(missing_reward="zero")
    )
    assert [t.rollout_id for t in trajectories] == ["e-no-reward", "a-retried"]
    assert report.rollouts_seen == 2


async def test_an_unknown_rollout_id_is_an_error(store: SQLiteStore) -> None:
    with pytest.raises(RolloutNotFoundError, match="'nobody'"):
        await collect(store, rollout_ids=["a-retried", "nobody"])


async def test_the_whole_store_walk_matches_the_per_rollout_reads(store: SQLiteStore) -> None:
    walked = [r async for r in store.iter_rollout_records()]
    ids = [r.rollout.rollout_id for r in walked]
    assert ids == sorted(ids) and "ghost" in ids and len(ids) == 8
    one_by_one = [r async for r in store.iter_rollout_records(ids)]
    assert walked == one_by_one
    for records in walked:
        calls = [c async for c in store.iter_llm_calls(records.rollout.rollout_id)]
        grouped = [c for a in records.attempts for c in a.calls] + records.other_calls
        assert sorted(grouped, key=lambda c: (c.attempt_id or "", c.sequence)) == sorted(
            calls, key=lambda c: (c.attempt_id or "", c.sequence)
        )


async def test_the_token_only_walk_is_the_full_walk_with_arrays_and_no_text(store: SQLiteStore) -> None:
    full = [r async for r in store.iter_rollout_records()]
    lean = [r async for r in store.iter_rollout_records(tokens_only=True)]
    lean_calls = [c for r in lean for c in [*(c for a in r.attempts for c in a.calls), *r.other_calls]]
    assert lean_calls and all(isinstance(c.prompt_token_ids, array) for c in lean_calls)
    for call in lean_calls:
        assert call.messages == [] and call.response_text is None and call.usage is None and call.trace_id is None
        call.prompt_token_ids = call.prompt_token_ids.tolist()
        call.response_token_ids = call.response_token_ids.tolist()
        call.response_logprobs = call.response_logprobs.tolist()
        call.token_policy_versions = call.token_policy_versions.tolist()
    for records in full:
        for call in [*(c for a in records.attempts for c in a.calls), *records.other_calls]:
            call.messages, call.response_text, call.usage, call.trace_id = [], None, None, None
            call.started_at = call.ended_at = None
    assert lean == full
    assert any(c.messages for r in [x async for x in store.iter_rollout_records()] for a in r.attempts for c in a.calls)


async def test_a_split_is_counted_by_kind(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "s.db") as store:
        await store.create_rollout({}, rollout_id="r")
        attempt = await store.start_attempt("r")
        breaks = [{"message_index": 1, "kind": "not_prefix_stable", "reason": "re-rendered"}]
        await store.add_llm_call(token_call("r", attempt.attempt_id, [1, 2], [3]))
        await store.add_llm_call(token_call("r", attempt.attempt_id, [1, 2, 4, 5], [6], prefix_breaks=breaks))
        await store.add_reward(Reward(rollout_id="r", attempt_id=attempt.attempt_id, value=1.0))
        await finish(store, "r", attempt.attempt_id, AttemptStatus.SUCCEEDED)
        (trajectory,), report = await collect(store)
    assert report.splits == {"prefix_break": 1} and report.segments == 2
    assert "re-rendered" in trajectory.segments[1].split_reason


# --- streaming: bounded memory whatever the store holds ----------------------------------------------


class CountingStore:
    """Wraps a store and counts the rollouts its walk has handed out."""

    def __init__(self, inner: SQLiteStore) -> None:
        self.inner = inner
        self.pulled = 0

    async def iter_rollout_records(self, rollout_ids: Any = None, *, tokens_only: bool = False) -> AsyncIterator[Any]:
        async for records in self.inner.iter_rollout_records(rollout_ids, tokens_only=tokens_only):
            self.pulled += 1
            yield records


def live_calls() -> int:
    """LLMCall objects alive in this process now."""
    return sum(1 for obj in gc.get_objects() if type(obj) is LLMCall)


@pytest.mark.slow
async def test_conversion_streams_rollout_by_rollout(tmp_path: Path) -> None:
    n_rollouts, calls_per = 240, 4
    async with SQLiteStore(tmp_path / "big.db", read_page_size=8) as store:
        for i in range(n_rollouts):
            rollout_id = f"r-{i:04d}"
            await store.create_rollout({"i": i}, rollout_id=rollout_id)
            attempt = await store.start_attempt(rollout_id)
            prompt: list[int] = [i]
            batch = []
            for turn in range(calls_per):
                batch.append(token_call(rollout_id, attempt.attempt_id, prompt, [turn + 100] * 50, sequence=turn))
                prompt = prompt + [turn + 100] * 50 + [7]
            await store.add_llm_calls(batch)
            await store.add_reward(Reward(rollout_id=rollout_id, attempt_id=attempt.attempt_id, value=1.0))
            await finish(store, rollout_id, attempt.attempt_id, AttemptStatus.SUCCEEDED)
        del batch
        gc.collect()
        baseline = live_calls()
        counting = CountingStore(store)
        received = most_ahead = most_live = 0
        async for trajectory in convert_store(counting):  # type: ignore[arg-type]
            received += 1
            most_ahead = max(most_ahead, counting.pulled - received)
            if received % 20 == 0:
                most_live = max(most_live, live_calls() - baseline)
            assert trajectory.num_calls == calls_per
    assert received == n_rollouts
    assert most_ahead == 0, "the converter read ahead of what it handed out"
    assert most_live <= 2 * calls_per, f"{most_live} calls alive at once; the converter should hold one rollout"


async def test_the_store_walk_reads_in_pages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with SQLiteStore(tmp_path / "paged.db", read_page_size=4) as store:
        for i in range(40):
            await store.create_rollout({}, rollout_id=f"r-{i:03d}")
            attempt = await store.start_attempt(f"r-{i:03d}")
            await store.add_llm_calls([token_call(f"r-{i:03d}", attempt.attempt_id, [1], [2]) for _ in range(3)])
        fetched: list[int] = []
        original = store._fetch

        async def counting_fetch(sql: str, params: Any) -> list[Any]:
            rows = await original(sql, params)
            fetched.append(len(rows))
            return rows

        monkeypatch.setattr(store, "_fetch", counting_fetch)
        walk = store.iter_rollout_records()
        first = await anext(walk)
        rows_before_first = sum(fetched)
        rest = [r async for r in walk]
    assert first.rollout.rollout_id == "r-000" and len(rest) == 39
    assert all(len(r.attempts[0].calls) == 3 for r in [first, *rest])
    assert max(fetched) <= 4, "a query returned more than one page"
    assert rows_before_first <= 4 * 4, "the walk read far ahead before handing out the first rollout"


async def test_leaving_a_conversion_early_leaves_the_store_usable(store: SQLiteStore) -> None:
    import contextlib

    async with contextlib.aclosing(convert_store(store)) as stream:
        async for _ in stream:
            break
    walk = store.iter_rollout_records()
    await anext(walk)  # a page of calls is in flight now (read_page_size=2)
    await walk.aclose()
    trajectories, _ = await collect(store)
    assert [t.rollout_id for t in trajectories] == ["a-retried"]
