"""The rollout graph (`agl_bridge.convert.graph`): each rule on token shapes modelled on real agents.

Prompts are built the way a chat template renders them: a system block, messages, and a
generation prompt `GEN` at the end; a reply sent back renders as `GEN + reply + END`.
"""

from __future__ import annotations

import pytest
from convert_helpers import call
from recorded import FIXTURE_NAMES, call_key, load_fixture, load_labels

from agl_bridge.convert import Trajectory, convert_attempt
from agl_bridge.convert.graph import SHARED_HISTORY_TOKENS, build_graph
from agl_bridge.types import CallClass, LLMCall

GEN = [900, 901]  # the template's generation prompt ("<|im_start|>assistant\n")
END = [902]  # the template's end of turn ("<|im_end|>")
STOP = 903  # the sampled stop token
SYSTEM = list(range(100, 100 + SHARED_HISTORY_TOKENS + 8))  # the agent's system prompt
TITLE_SYSTEM = [100, 101, *range(500, 540)]  # another system prompt sharing only two opening tokens


def reply(*ids: int) -> list[int]:
    return [*ids, STOP]


def classes(calls: list[LLMCall]) -> dict[int, str]:
    graph = build_graph(calls)
    return {key[0]: node.call_class.value for key, node in sorted(graph.nodes.items())}


def parents(calls: list[LLMCall]) -> dict[int, int | None]:
    graph = build_graph(calls)
    return {key[0]: None if node.parent is None else node.parent[0] for key, node in sorted(graph.nodes.items())}


def turns(first_sequence: int, system: list[int], *pairs: tuple[list[int], list[int]]) -> list[LLMCall]:
    """A conversation whose prompts extend exactly: observation k, then GEN, sampled reply k."""
    out: list[LLMCall] = []
    history = list(system)
    for index, (observation, response) in enumerate(pairs):
        prompt = history + observation + GEN
        out.append(call(first_sequence + index, prompt, response))
        history = prompt + response
    return out


def test_a_conversation_is_main_with_each_turn_the_parent_of_the_next() -> None:
    calls = turns(1, SYSTEM, ([1, 2], reply(10)), ([3], reply(11)), ([4], reply(12)))
    assert classes(calls) == {1: "main", 2: "main", 3: "main"}
    assert parents(calls) == {1: None, 2: 1, 3: 2}


def test_a_title_call_is_side_even_when_it_is_recorded_last() -> None:
    main = turns(2, SYSTEM, ([1, 2], reply(10)), ([3], reply(11)))
    title_first = [call(1, [*TITLE_SYSTEM, 1, 2, *GEN], reply(70, 71)), *main]
    assert classes(title_first) == {1: "side", 2: "main", 3: "main"}
    title_last = [*turns(1, SYSTEM, ([1, 2], reply(10)), ([3], reply(11))), call(3, [*TITLE_SYSTEM, 1, *GEN], reply(7))]
    assert classes(title_last) == {1: "main", 2: "main", 3: "side"}


def test_a_client_retry_is_the_discarded_sibling() -> None:
    first = call(1, [*SYSTEM, 1, *GEN], reply(10))
    again = call(2, [*SYSTEM, 1, *GEN], reply(20, 21))
    after = call(3, [*SYSTEM, 1, *GEN, 20, 21, STOP, *END, 4, *GEN], reply(30))
    assert classes([first, again, after]) == {1: "retry", 2: "main", 3: "main"}
    assert parents([first, again, after]) == {1: None, 2: None, 3: 2}


def test_the_last_call_sent_twice_keeps_the_later_one_as_main() -> None:
    calls = [call(1, [*SYSTEM, 1, *GEN], reply(10)), call(2, [*SYSTEM, 1, *GEN], reply(11))]
    assert classes(calls) == {1: "retry", 2: "main"}


def test_a_reply_re_rendered_by_the_template_still_continues_its_turn() -> None:
    # Turn 2 sends turn 1's reply back rendered differently (Qwen3 drops <think>): its prompt starts
    # with all of turn 1's prompt but not with turn 1's sampled ids.
    first = call(1, [*SYSTEM, 1, *GEN], reply(50, 51, 10))
    second = call(2, [*SYSTEM, 1, *GEN, 10, *END, 2, *GEN], reply(11))
    assert classes([first, second]) == {1: "main", 2: "main"}
    assert parents([first, second]) == {1: None, 2: 1}


def test_compaction_that_continues_the_conversation_then_a_shorter_restart_carrying_it() -> None:
    # Claude Code's /compact: "summarize the above" as one more turn, then the conversation starts
    # over from the system prompt and the summary.
    before = turns(1, SYSTEM, ([1, 2, 3, 4, 5, 6], reply(10, 11, 12)), ([7, 8, 9], reply(13, 14, 15)))
    summary = [60, 61, 62, 63, 64]
    compact = call(3, [*before[-1].prompt_token_ids, 13, 14, 15, STOP, *END, 99, *GEN], reply(*summary))
    restart = turns(4, SYSTEM, ([*summary, 5], reply(20)), ([6], reply(21)))
    assert classes([*before, compact, *restart]) == {1: "main", 2: "main", 3: "compaction", 4: "main", 5: "main"}
    assert parents([*before, compact, *restart])[4] == 3


def test_compaction_by_a_summarizer_of_its_own_and_a_retried_compaction() -> None:
    before = turns(1, SYSTEM, ([1, 2, 3, 4, 5, 6, 7, 8], reply(10, 11, 12)), ([9], reply(13)))
    summarizer_prompt = [*TITLE_SYSTEM, 1, 2, 3, 10, 11, *GEN]
    failed = call(3, summarizer_prompt, reply(40))
    summarized = call(4, summarizer_prompt, reply(60, 61, 62, 63, 64))
    restart = turns(5, SYSTEM, ([60, 61, 62, 63, 64], reply(20)))
    assert classes([*before, failed, summarized, *restart]) == {
        1: "main",
        2: "main",
        3: "retry",
        4: "compaction",
        5: "main",
    }


def test_a_compaction_sent_without_tools_and_many_compactions_in_a_row() -> None:
    # Codex: the compaction request renders the same system prompt without the tools block, so it
    # shares the history's opening tokens but extends nothing; opencode compacts again and again.
    calls: list[LLMCall] = []
    sequence = 1
    carried: list[int] = []
    no_tools = SYSTEM[:-4]
    for round_index in range(4):
        long_turns = turns(sequence, SYSTEM, ([*carried, *range(1, 12)], reply(10 + round_index, 11)))
        calls += long_turns
        sequence += len(long_turns)
        conversation = long_turns[-1].prompt_token_ids[len(SYSTEM) :] + long_turns[-1].response_token_ids
        summary = [60 + round_index, 61, 62, 63, 64]
        calls.append(call(sequence, [*no_tools, *conversation, *END, 99, *GEN], reply(*summary)))
        sequence += 1
        carried = summary
    calls += turns(sequence, SYSTEM, (carried, reply(20)))
    found = classes(calls)
    assert [found[c.sequence] for c in calls] == ["main", "compaction"] * 4 + ["main"]


def test_a_sub_agent_whose_answer_returns_as_a_tool_result() -> None:
    spawn = call(1, [*SYSTEM, 1, *GEN], reply(30, 31))  # the tool call that starts the sub-agent
    sub = turns(2, TITLE_SYSTEM, ([5], reply(40)), ([6], reply(41, 42, 43, 44, 45)))
    back = call(4, [*SYSTEM, 1, *GEN, 30, 31, STOP, *END, 41, 42, 43, 44, 45, *GEN], reply(32))
    assert classes([spawn, *sub, back]) == {1: "main", 2: "subagent", 3: "subagent", 4: "main"}
    assert parents([spawn, *sub, back]) == {1: None, 2: 1, 3: 2, 4: 1}
    lone_sub = call(2, [*TITLE_SYSTEM, 5, *GEN], reply(41, 42, 43, 44, 45))
    assert classes([spawn, lone_sub, back]) == {1: "main", 2: "subagent", 4: "main"}


def test_a_conversation_rendered_afresh_each_turn_stays_main() -> None:
    # DSPy renders every prompt anew: the history becomes fields of a longer new prompt.
    calls = [
        call(1, [*SYSTEM, 1, *GEN], reply(10, 11, 12, 13)),
        call(2, [*SYSTEM, 7, 1, 10, 11, 12, 13, 2, *GEN], reply(20, 21, 22, 23)),
        call(3, [*SYSTEM, 7, 1, 10, 11, 12, 13, 2, 20, 21, 22, 23, 3, *GEN], reply(30)),
    ]
    assert classes(calls) == {1: "main", 2: "main", 3: "main"}


def test_choices_of_one_request_take_its_class_and_a_continued_choice_its_children() -> None:
    prompt = [*SYSTEM, 1, *GEN]
    calls = [call(1, prompt, reply(10), choice=0), call(1, prompt, reply(11), choice=1)]
    calls.append(call(2, [*prompt, 11, STOP, *END, 2, *GEN], reply(12)))
    graph = build_graph(calls)
    assert {key: node.call_class for key, node in graph.nodes.items()} == {
        (1, 0): CallClass.MAIN,
        (1, 1): CallClass.MAIN,
        (2, 0): CallClass.MAIN,
    }
    assert graph.nodes[(2, 0)].parent == (1, 1)


def test_a_declared_class_and_parent_win_and_bad_parents_are_warned_about() -> None:
    main = turns(1, SYSTEM, ([1], reply(10)), ([2], reply(11)))
    declared = call(3, [*TITLE_SYSTEM, 1, *GEN], reply(7))
    declared.declared_class = CallClass.COMPACTION
    unknown = call(4, [*TITLE_SYSTEM, 2, *GEN], reply(8))
    unknown.declared_parent = "chatcmpl-nobody"
    later = call(5, [*TITLE_SYSTEM, 3, *GEN], reply(9))
    later.declared_parent = "6"
    spawned = call(6, [*TITLE_SYSTEM, 4, *GEN], reply(6))
    spawned.declared_parent = "1"
    graph = build_graph([*main, declared, unknown, later, spawned])
    assert graph.nodes[(3, 0)].call_class is CallClass.COMPACTION and graph.nodes[(3, 0)].declared
    assert graph.nodes[(6, 0)].call_class is CallClass.SUBAGENT and graph.nodes[(6, 0)].parent == (1, 0)
    assert len(graph.warnings) == 2
    assert "'chatcmpl-nobody'" in graph.warnings[0] and "no call of this attempt" in graph.warnings[0]
    assert "declared parent sequence 6, which is not an earlier call" in graph.warnings[1]


def test_declared_main_conversations_running_at_once_are_named_in_a_warning() -> None:
    first = call(1, [*SYSTEM, 1, *GEN], reply(10))
    other = call(2, [*TITLE_SYSTEM, 1, *GEN], reply(11))
    other.declared_class = CallClass.MAIN
    last = call(3, [*SYSTEM, 1, *GEN, 10, STOP, *END, 2, *GEN], reply(12))
    graph = build_graph([first, other, last])
    assert all(node.call_class is CallClass.MAIN for node in graph.nodes.values())
    assert any("two main conversations run at once" in warning for warning in graph.warnings)


def test_a_lone_call_is_main_and_text_calls_are_outside_the_graph() -> None:
    from convert_helpers import text_call

    graph = build_graph([call(1, [*SYSTEM, *GEN], reply(10)), text_call(2)])
    assert list(graph.nodes) == [(1, 0)] and graph.nodes[(1, 0)].call_class is CallClass.MAIN
    assert build_graph([]).nodes == {}


def test_a_recorded_prefix_break_links_a_re_rendered_turn_to_the_closest_earlier_prompt() -> None:
    # A template that is not prefix-stable re-renders the earlier turns too: no token check links the
    # turns, but the proxy recorded that the request re-sent a reply of ours.
    first = call(1, [*SYSTEM, 1, *GEN], reply(10))
    title = call(2, [*TITLE_SYSTEM, 1, *GEN], reply(7))
    broken = [{"message_index": 2, "kind": "not_prefix_stable", "reason": "re-rendered"}]
    second = call(3, [*SYSTEM[:20], 55, 56, *GEN, 10, *END, 2, *GEN], reply(11), prefix_breaks=broken)
    assert classes([first, title, second]) == {1: "main", 2: "side", 3: "main"}
    assert parents([first, title, second])[3] == 1


# --- the recorded real-agent sessions (tests/convert/fixtures/, labelled by hand) -----------------


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_every_recorded_call_gets_its_labelled_class(name: str) -> None:
    labels = load_labels(name)
    for attempt in load_fixture(name):
        graph = build_graph(attempt.calls)
        found = {call_key(call): graph.nodes[(call.sequence, call.choice_index)] for call in attempt.calls}
        wrong = {
            key: f"{node.call_class.value}, labelled {labels[key].call_class}: {node.reason}"
            for key, node in found.items()
            if node.call_class.value != labels[key].call_class
        }
        assert not wrong, wrong
        assert not graph.warnings


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_a_recorded_session_trains_only_its_main_conversation_and_sub_agents(name: str) -> None:
    labels = load_labels(name)
    (attempt,) = load_fixture(name)
    trajectory = convert_attempt(attempt.calls, attempt.rewards, "succeeded")
    assert isinstance(trajectory, Trajectory)
    trained = {
        f"{attempt.rollout_id}/{attempt.attempt_id}/{c.sequence}/{c.choice_index}"
        for s in trajectory.segments
        for c in s.calls
    }
    assert trained == {key for key, label in labels.items() if label.call_class in ("main", "subagent")}
    for segment in trajectory.segments:  # token fidelity: every trained id is a sampled id of its call
        by_sequence = {call.sequence: call for call in attempt.calls}
        for spot in segment.calls:
            sampled = list(by_sequence[spot.sequence].response_token_ids)
            assert segment.input_ids[spot.response_start : spot.response_end] == sampled
