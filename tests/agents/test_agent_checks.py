"""The recipe tests' checks fail when they should: on records that break the promises they check."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from agent_checks import (
    auxiliary_by_content,
    check_multi_turn,
    check_reached_and_answered,
    check_recorded,
    continuations,
)
from http_tap import Exchange

from agl_bridge.types import LLMCall

PREFIX = "/rollout/ro-1/attempt/at-1/"


def _decode(ids: Sequence[int]) -> str:
    """A stand-in tokenizer: id 78 decodes to the text of ids 7 and 8, as a BPE merge would."""
    return "".join(map(str, ids))


def _call(sequence: int, prompt: list[int], response: list[int], **fields: object) -> LLMCall:
    return LLMCall(
        rollout_id="ro-1",
        attempt_id="at-1",
        sequence=sequence,
        model="tiny",
        prompt_token_ids=prompt,
        response_token_ids=response,
        response_logprobs=[-1.0] * len(response),
        token_policy_versions=[0] * len(response),
        **fields,  # type: ignore[arg-type]
    )


def _exchange(path: str = PREFIX + "v1/chat/completions", status: int = 200) -> Exchange:
    return Exchange("POST", path, status, b"{}", b"")


def test_a_continued_turn_that_extends_prompt_and_response_passes() -> None:
    first = _call(0, [1, 2, 3], [7, 8, 2])
    side = _call(1, [1, 9], [4])  # another prompt (a title call): pairs with nothing
    second = _call(2, [1, 2, 3, 7, 8, 2, 5, 6], [9])
    assert continuations([first, side, second]) == [(first, second)]
    assert check_multi_turn([first, side, second], _decode) == []


def test_a_continued_turn_that_drops_sampled_ids_fails_unless_its_record_says_why() -> None:
    first = _call(0, [1, 2, 3], [7, 8, 2])
    retokenized = _call(1, [1, 2, 3, 78, 2, 5], [9])
    with pytest.raises(AssertionError, match="does not extend"):
        check_multi_turn([first, retokenized], _decode)
    declared = _call(1, [1, 2, 3, 78, 2, 5], [9], prefix_breaks=[{"kind": "rendered_differently"}])
    assert check_multi_turn([first, declared], _decode) == []


def test_a_reply_the_agent_changed_before_sending_it_back_is_reported_not_failed() -> None:
    first = _call(0, [1, 2, 3], [7, 8, 2])
    edited = _call(1, [1, 2, 3, 9, 9, 2, 5], [9])  # the text differs: nothing could carry the sampled ids
    assert check_multi_turn([first, edited], _decode) == [1]


def test_a_turn_ended_by_another_stop_token_must_still_extend() -> None:
    first = _call(0, [1, 2, 3], [7, 8, 0])  # stopped on <|endoftext|>; the template ends turns with id 2
    check_multi_turn([first, _call(1, [1, 2, 3, 7, 8, 0, 2, 5], [9])], _decode)  # kept, then the template's id
    with pytest.raises(AssertionError, match="keeps call 0's sampled ids but not its stop token 0"):
        check_multi_turn([first, _call(1, [1, 2, 3, 7, 8, 2, 5], [9])], _decode)  # the stop token dropped


def test_no_continued_turn_fails() -> None:
    with pytest.raises(AssertionError, match="not continued"):
        check_multi_turn([_call(0, [1, 2], [3]), _call(1, [1, 4], [3])], _decode)


def test_refused_or_stray_requests_fail() -> None:
    check_reached_and_answered([_exchange()], PREFIX)
    with pytest.raises(AssertionError, match="never asked"):
        check_reached_and_answered([Exchange("GET", PREFIX + "v1/models", 200, b"", b"")], PREFIX)
    with pytest.raises(AssertionError, match="refused"):
        check_reached_and_answered([_exchange(status=400)], PREFIX)
    streamed_error = Exchange("POST", PREFIX + "v1/messages", 200, b"{}", b"event: error\ndata: {}", stream_error=True)
    with pytest.raises(AssertionError, match="error event in the stream"):
        check_reached_and_answered([_exchange(), streamed_error], PREFIX)
    with pytest.raises(AssertionError, match="outside the rollout prefix"):
        check_reached_and_answered([_exchange("/v1/chat/completions")], PREFIX)


def test_a_lost_record_or_misaligned_logprobs_fail() -> None:
    call = _call(0, [1, 2], [3, 4])
    check_recorded([call], [_exchange()], "ro-1", "at-1")
    with pytest.raises(AssertionError, match=r"2 model requests were answered \(0 streams left .*\) but 1"):
        check_recorded([call], [_exchange(), _exchange()], "ro-1", "at-1")
    left = Exchange("POST", PREFIX + "v1/chat/completions", 200, b"{}", b"data: {}", abandoned=True)
    check_recorded([call], [_exchange(), left], "ro-1", "at-1")  # cancelled before its sample ended
    check_recorded([call, _call(1, [1, 5], [6])], [_exchange(), left], "ro-1", "at-1")  # ended before the hang-up
    with pytest.raises(AssertionError, match="but 0 are recorded"):
        check_recorded([], [_exchange(), left], "ro-1", "at-1")
    misaligned = _call(0, [1, 2], [3, 4])
    misaligned.response_logprobs.pop()
    with pytest.raises(AssertionError):
        check_recorded([misaligned], [_exchange()], "ro-1", "at-1")


def test_title_and_summary_calls_are_told_by_what_they_say() -> None:
    def said(sequence: int, system: str, user: str | list[dict[str, str]]) -> LLMCall:
        return _call(
            sequence, [1], [2], messages=[{"role": "system", "content": system}, {"role": "user", "content": user}]
        )

    opencode = "You are opencode, an interactive CLI tool. " + "x" * 400 + " You are a context summarization agent"
    calls = [
        said(0, "You are a title generator. You output ONLY a thread title.", "What is 2 + 3?"),
        said(1, opencode, "What is 2 + 3?"),  # the words deep in a main prompt do not count
        said(2, "You are a context summarization agent. You are given a conversation", "Here it is"),
        said(
            3,
            "You are Claude Code",
            [{"type": "text", "text": "Your task is to create a detailed summary of the conversation so far"}],
        ),
        said(4, "You are Codex", "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary"),
        said(5, "You are Codex", "Summarize nothing; add 4."),
    ]
    assert auxiliary_by_content(calls) == {0: "title", 2: "summary", 3: "summary", 4: "summary"}
