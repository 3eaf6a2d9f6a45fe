"""`convert_attempt`: which attempts and calls train, the missing-reward policies, bad input, invariants."""

from __future__ import annotations

import pytest
from convert_helpers import AID, RID, call, conversation, reward, text_call
from hypothesis import given, settings
from hypothesis import strategies as st

from agl_bridge.convert import (
    ALL_CALL_CLASSES,
    ConvertOptions,
    DropReason,
    MissingRewardError,
    Trajectory,
    check_segment,
    convert_attempt,
)
from agl_bridge.types import AttemptStatus

CALLS = conversation([([1, 2], [3]), ([4], [5, 6])])
REWARDS = [reward(9, 1.0)]


@pytest.mark.parametrize(
    ("status", "reason"),
    [("failed", DropReason.FAILED), ("timed_out", DropReason.TIMED_OUT), ("running", DropReason.NOT_FINISHED)],
)
def test_only_succeeded_attempts_train(status: str, reason: DropReason) -> None:
    assert convert_attempt(CALLS, REWARDS, status) is reason
    assert convert_attempt(CALLS, REWARDS, AttemptStatus(status)) is reason


def test_a_succeeded_attempt_carries_ids_group_and_task() -> None:
    result = convert_attempt(CALLS, REWARDS, "succeeded", group_id="g-7", task={"q": "2+2"})
    assert isinstance(result, Trajectory)
    assert (result.rollout_id, result.attempt_id, result.group_id, result.task) == (RID, AID, "g-7", {"q": "2+2"})
    assert result.num_calls == 2 and not result.missing_reward


def test_text_calls_never_train() -> None:
    result = convert_attempt([text_call(0), *conversation([([1], [2])], first_sequence=1)], REWARDS, "succeeded")
    assert isinstance(result, Trajectory)
    assert [c.sequence for s in result.segments for c in s.calls] == [1]
    assert convert_attempt([text_call(0), text_call(1)], REWARDS, "succeeded") is DropReason.NO_TRAINABLE_CALLS


def test_no_calls_at_all_means_no_trainable_calls() -> None:
    assert convert_attempt([], REWARDS, "succeeded") is DropReason.NO_TRAINABLE_CALLS


def test_agent_selection() -> None:
    calls = [call(0, [1], [2], agent="solver"), call(1, [7], [8], agent="critic"), call(2, [9], [10])]

    def chosen(**options: object) -> list[int]:
        result = convert_attempt(calls, REWARDS, "succeeded", ConvertOptions(train_classes=ALL_CALL_CLASSES, **options))
        return [c.sequence for s in result.segments for c in s.calls]

    assert chosen() == [0, 1, 2]
    assert chosen(agent_names=["solver"]) == [0]
    assert chosen(agent_names={"critic", None}) == [1, 2]
    result = convert_attempt(calls, REWARDS, "succeeded", ConvertOptions(agent_names=["nobody"]))
    assert result is DropReason.NO_TRAINABLE_CALLS
    by_default = convert_attempt(calls, REWARDS, "succeeded", ConvertOptions(agent_names={"critic", None}))
    assert isinstance(by_default, Trajectory)  # three lone calls: the last is main, the others side
    assert [c.sequence for s in by_default.segments for c in s.calls] == [2]
    assert [
        (c.sequence, c.call_class, c.reason.startswith("side calls do not train")) for c in by_default.excluded_calls
    ] == [
        (0, "side", True),
        (1, "side", True),
    ]


def test_model_selection_combines_with_agents() -> None:
    calls = [
        call(0, [1], [2], model="a", agent="x"),
        call(1, [3], [4], model="b", agent="x"),
        call(2, [5], [6], model="a"),
    ]
    every = ALL_CALL_CLASSES
    result = convert_attempt(
        calls, REWARDS, "succeeded", ConvertOptions(models=["a"], agent_names=["x"], train_classes=every)
    )
    assert [c.sequence for s in result.segments for c in s.calls] == [0]
    result = convert_attempt(calls, REWARDS, "succeeded", ConvertOptions(models=["a"], train_classes=every))
    assert [c.sequence for s in result.segments for c in s.calls] == [0, 2]


def test_missing_reward_drop_is_the_default() -> None:
    assert convert_attempt(CALLS, [], "succeeded") is DropReason.MISSING_REWARD


def test_missing_reward_zero_trains_with_return_zero_and_says_so() -> None:
    result = convert_attempt(CALLS, [], "succeeded", ConvertOptions(missing_reward="zero"))
    assert isinstance(result, Trajectory)
    assert result.reward == 0.0 and result.rewards == {} and result.missing_reward


def test_missing_reward_error_names_the_rollout_and_attempt() -> None:
    with pytest.raises(MissingRewardError) as info:
        convert_attempt(CALLS, [], "succeeded", ConvertOptions(missing_reward="error"))
    assert (info.value.rollout_id, info.value.attempt_id) == (RID, AID)
    assert f"rollout {RID!r} attempt {AID!r}" in str(info.value) and "emit_reward" in str(info.value)


def test_missing_reward_policy_applies_only_to_attempts_that_would_train() -> None:
    options = ConvertOptions(missing_reward="error")
    assert convert_attempt(CALLS, [], "failed", options) is DropReason.FAILED
    assert convert_attempt([text_call(0)], [], "succeeded", options) is DropReason.NO_TRAINABLE_CALLS


def test_a_zero_reward_is_a_reward_not_a_missing_one() -> None:
    result = convert_attempt(CALLS, [reward(9, 0.0)], "succeeded")
    assert isinstance(result, Trajectory) and result.reward == 0.0 and not result.missing_reward


def test_records_of_another_attempt_are_refused() -> None:
    other = call(5, [1], [2], attempt_id="at-2")
    with pytest.raises(ValueError, match="convert one attempt at a time"):
        convert_attempt([*CALLS, other], REWARDS, "succeeded")
    with pytest.raises(ValueError, match="'at-2'"):
        convert_attempt(CALLS, [reward(9, 1.0, attempt_id="at-2")], "succeeded")


def test_records_without_a_sequence_are_refused() -> None:
    unordered = call(0, [1], [2])
    unordered.sequence = None
    with pytest.raises(ValueError, match="without a sequence"):
        convert_attempt([unordered], REWARDS, "succeeded")


def test_ids_can_be_given_when_no_record_names_them() -> None:
    with pytest.raises(ValueError, match="pass rollout_id= and attempt_id="):
        convert_attempt([], [], "succeeded")
    assert convert_attempt([], [], "failed", rollout_id="r", attempt_id="a") is DropReason.FAILED


def test_options_are_validated_with_the_option_named() -> None:
    with pytest.raises(ValueError, match="missing_reward must be one of"):
        ConvertOptions(missing_reward="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"reward_weights\['x'\] must be a finite number"):
        ConvertOptions(reward_weights={"x": float("nan")})
    with pytest.raises(ValueError, match="agent_names must be a collection"):
        ConvertOptions(agent_names="solver")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="models is empty"):
        ConvertOptions(models=[])


# --- invariants over random conversations -----------------------------------------------------------

token = st.integers(min_value=0, max_value=40)


@st.composite
def attempts(draw: st.DrawFn) -> list:
    """Calls that sometimes extend the last call's tokens, sometimes not, sometimes with n choices."""
    calls = []
    previous: list[int] = []
    for sequence in range(draw(st.integers(1, 6))):
        if previous and draw(st.booleans()):
            prompt = previous + draw(st.lists(token, max_size=3))
        else:
            prompt = draw(st.lists(token, min_size=1, max_size=6))
        choices = draw(st.integers(1, 3))
        responses = [draw(st.lists(token, max_size=4)) for _ in range(choices)]
        for index, response in enumerate(responses):
            model = draw(st.sampled_from(["a", "a", "b"])) if index == 0 else calls[-1].model
            calls.append(call(sequence, prompt, response, choice=index, model=model))
        previous = prompt + responses[draw(st.integers(0, choices - 1))]
    return calls


@settings(max_examples=200, deadline=None)
@given(attempts())
def test_every_call_is_trained_or_excluded_exactly_once(calls: list) -> None:
    result = convert_attempt(calls, [reward(100, 1.0)], "succeeded")
    assert isinstance(result, Trajectory)
    trained = [(spot.sequence, spot.choice_index) for segment in result.segments for spot in segment.calls]
    excluded = [(call.sequence, call.choice_index) for call in result.excluded_calls]
    assert sorted(trained + excluded) == sorted((c.sequence, c.choice_index) for c in calls)
    assert {spot.call_class for segment in result.segments for spot in segment.calls} <= {"main", "subagent"}
    assert {call.call_class for call in result.excluded_calls} <= {"retry", "side", "compaction"}


@settings(max_examples=200, deadline=None)
@given(attempts())
def test_every_call_sits_exactly_once_with_its_stored_tokens(calls: list) -> None:
    result = convert_attempt(calls, [reward(100, 1.0)], "succeeded", ConvertOptions(train_classes=ALL_CALL_CLASSES))
    assert isinstance(result, Trajectory)
    placed = {}
    for segment in result.segments:
        check_segment(segment)  # mask = the responses; 0.0 / -1 elsewhere
        for spot in segment.calls:
            placed[(spot.sequence, spot.choice_index)] = (segment, spot)
    assert sorted(placed) == sorted((c.sequence, c.choice_index) for c in calls)
    for stored in calls:
        segment, spot = placed[(stored.sequence, stored.choice_index)]
        assert segment.model == stored.model
        assert segment.input_ids[: spot.response_start] == stored.prompt_token_ids
        assert segment.input_ids[spot.response_start : spot.response_end] == stored.response_token_ids
        assert segment.sampler_logprobs[spot.response_start : spot.response_end] == stored.response_logprobs
        assert segment.policy_versions[spot.response_start : spot.response_end] == stored.token_policy_versions
    assert result.segments[0].split_kind is None
    assert all(segment.split_kind is not None for segment in result.segments[1:])
