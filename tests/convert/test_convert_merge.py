"""Multi-turn merge: one segment while prompts extend, a recorded reason for every split, exact alignment."""

from __future__ import annotations

from convert_helpers import call, conversation, logprobs_for, reward

from agl_bridge.convert import ALL_CALL_CLASSES, ConvertOptions, SplitKind, Trajectory, check_segment, convert_attempt


def convert(calls, **options) -> Trajectory:
    # Merging is about every call: train all classes (which calls train by class: test_convert_graph.py).
    result = convert_attempt(
        calls, [reward(1_000, 1.0)], "succeeded", ConvertOptions(**{"train_classes": ALL_CALL_CLASSES, **options})
    )
    assert isinstance(result, Trajectory), result
    for segment in result.segments:
        check_segment(segment)
    return result


def test_extending_turns_merge_into_one_segment_with_exact_alignment() -> None:
    calls = conversation([([1, 2, 3], [10, 11]), ([4, 5], [12]), ([6], [13, 14, 15])])
    (segment,) = convert(calls).segments
    assert segment.input_ids == [1, 2, 3, 10, 11, 4, 5, 12, 6, 13, 14, 15]
    assert segment.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1]
    lp0, lp1, lp2 = logprobs_for(0, 2), logprobs_for(1, 1), logprobs_for(2, 3)
    assert segment.sampler_logprobs == [0.0, 0.0, 0.0, *lp0, 0.0, 0.0, *lp1, 0.0, *lp2]
    assert segment.policy_versions == [-1, -1, -1, 10, 10, -1, -1, 11, -1, 12, 12, 12]
    assert [(c.sequence, c.response_start, c.response_end) for c in segment.calls] == [(0, 3, 5), (1, 7, 8), (2, 9, 12)]
    assert segment.split_kind is None and segment.split_reason is None
    # Token fidelity: each call's prompt and response are exactly the stored ids.
    for stored, placed in zip(calls, segment.calls, strict=False):
        assert segment.input_ids[: placed.response_start] == stored.prompt_token_ids
        assert segment.input_ids[placed.response_start : placed.response_end] == stored.response_token_ids


def test_a_prompt_equal_to_the_previous_prompt_plus_response_merges_with_no_observation() -> None:
    calls = [call(0, [1, 2], [3]), call(1, [1, 2, 3], [4, 5])]
    (segment,) = convert(calls).segments
    assert segment.input_ids == [1, 2, 3, 4, 5] and segment.loss_mask == [0, 0, 1, 1, 1]


def test_per_token_versions_are_kept_when_weights_swap_mid_call() -> None:
    (segment,) = convert([call(0, [1], [2, 3, 4], versions=[5, 5, 6])]).segments
    assert segment.policy_versions == [-1, 5, 5, 6]


def test_a_call_without_per_token_versions_uses_its_policy_version_or_minus_one() -> None:
    calls = [call(0, [1], [2, 3], versions=[], policy_version=7), call(1, [1, 2, 3, 9], [4], versions=[])]
    (segment,) = convert(calls).segments
    assert segment.policy_versions == [-1, 7, 7, -1, -1]
    assert segment.loss_mask == [0, 1, 1, 0, 1]


def test_a_prompt_that_does_not_extend_starts_a_new_segment_and_says_where() -> None:
    calls = [call(0, [1, 2, 3], [10, 11]), call(1, [1, 2, 99, 10, 11, 4], [12])]
    first, second = convert(calls).segments
    assert first.input_ids == [1, 2, 3, 10, 11] and first.split_kind is None
    assert second.input_ids == [1, 2, 99, 10, 11, 4, 12]
    assert second.loss_mask == [0, 0, 0, 0, 0, 0, 1]
    assert second.split_kind is SplitKind.NOT_EXTENDING
    assert "sequence 1" in second.split_reason and "at token 2" in second.split_reason
    assert "id 99" in second.split_reason and "id 3" in second.split_reason


def test_a_prompt_shorter_than_the_previous_tokens_starts_a_new_segment() -> None:
    calls = [call(0, [1, 2, 3], [10, 11]), call(1, [1, 2, 3], [12])]  # a retry of the same prompt
    first, second = convert(calls).segments
    assert second.split_kind is SplitKind.NOT_EXTENDING
    assert "prompt (3 tokens) ends before" in second.split_reason and "(5 tokens)" in second.split_reason


def test_a_prefix_break_recorded_by_the_proxy_explains_the_split() -> None:
    breaks = [{"message_index": 1, "kind": "rendered_differently", "reason": "the template dropped <think>"}]
    calls = [call(0, [1, 2, 3], [10, 11, 12]), call(1, [1, 2, 3, 10, 12, 4], [13], prefix_breaks=breaks)]
    first, second = convert(calls).segments
    assert second.split_kind is SplitKind.PREFIX_BREAK
    assert "at token 4" in second.split_reason
    assert "message 1 rendered_differently: the template dropped <think>" in second.split_reason


def test_prefix_break_records_do_not_split_when_the_tokens_still_extend() -> None:
    # The token check is the authority: a break recorded for an earlier message does not matter here.
    breaks = [{"message_index": 0, "kind": "not_prefix_stable", "reason": "x"}]
    calls = [call(0, [1, 2], [3]), call(1, [1, 2, 3, 4], [5], prefix_breaks=breaks)]
    assert len(convert(calls).segments) == 1


def test_a_split_then_the_new_segment_keeps_merging() -> None:
    calls = [call(0, [1], [2]), call(1, [7], [8]), call(2, [7, 8, 9], [10])]
    first, second = convert(calls).segments
    assert second.input_ids == [7, 8, 9, 10] and [c.sequence for c in second.calls] == [1, 2]


def test_two_agents_taking_turns_keep_one_segment_each() -> None:
    calls = [
        call(0, [1, 2], [3], agent="a"),
        call(1, [50, 51], [52], agent="b"),
        call(2, [1, 2, 3, 4], [5], agent="a"),
        call(3, [50, 51, 52, 53], [54], agent="b"),
    ]
    a, b = convert(calls).segments
    assert a.input_ids == [1, 2, 3, 4, 5] and [c.sequence for c in a.calls] == [0, 2]
    assert b.input_ids == [50, 51, 52, 53, 54] and [c.sequence for c in b.calls] == [1, 3]
    assert b.split_kind is SplitKind.NOT_EXTENDING  # b's first call did not extend a's tokens


def test_a_model_change_splits_even_when_the_tokens_extend() -> None:
    calls = [call(0, [1, 2], [3], model="policy-a"), call(1, [1, 2, 3, 4], [5], model="policy-b")]
    first, second = convert(calls).segments
    assert (first.model, second.model) == ("policy-a", "policy-b")
    assert second.split_kind is SplitKind.MODEL_CHANGED and "'policy-b'" in second.split_reason


def test_n_choices_branch_and_the_first_choice_continues() -> None:
    calls = [
        call(0, [1, 2], [3, 4], choice=0),
        call(0, [1, 2], [5], choice=1),
        call(1, [1, 2, 3, 4, 9], [6]),  # the agent carried on with choice 0
    ]
    main, branch = convert(calls).segments
    assert main.input_ids == [1, 2, 3, 4, 9, 6]
    assert [(c.sequence, c.choice_index) for c in main.calls] == [(0, 0), (1, 0)]
    assert branch.input_ids == [1, 2, 5] and branch.loss_mask == [0, 0, 1]
    assert branch.sampler_logprobs == [0.0, 0.0, *logprobs_for(0, 1, choice=1)]
    assert branch.split_kind is SplitKind.CHOICE_BRANCH and "choice 1" in branch.split_reason


def test_the_branch_the_agent_carried_on_with_is_the_one_that_grows() -> None:
    calls = [
        call(0, [1, 2], [3], choice=0),
        call(0, [1, 2], [4], choice=1),
        call(0, [1, 2], [5], choice=2),
        call(1, [1, 2, 5, 9], [6]),  # the agent picked choice 2
    ]
    first, second, third = convert(calls).segments
    assert first.input_ids == [1, 2, 3] and second.input_ids == [1, 2, 4]
    assert third.input_ids == [1, 2, 5, 9, 6]
    assert [(c.sequence, c.choice_index) for c in third.calls] == [(0, 2), (1, 0)]
    assert third.loss_mask == [0, 0, 1, 0, 1]


def test_identical_choices_prefer_the_first_choice_branch() -> None:
    calls = [call(0, [1], [2], choice=0), call(0, [1], [2], choice=1), call(1, [1, 2, 3], [4])]
    first, second = convert(calls).segments
    assert [c.sequence for c in first.calls] == [0, 1] and len(second.calls) == 1


def test_segments_come_in_order_of_their_first_call() -> None:
    calls = [call(0, [1], [2]), call(1, [5], [6]), call(2, [1, 2, 3], [4]), call(3, [8], [9])]
    assert [s.calls[0].sequence for s in convert(calls).segments] == [0, 1, 3]
