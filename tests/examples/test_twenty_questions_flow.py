"""The CrewAI flow: routing, a full game won by a scripted player, and bad input costing turns only."""

from __future__ import annotations

from typing import Any

import pytest
import twenty_questions_helpers  # noqa: F401  (puts the example on the import path)
from twenty_q.agent import PlayerSettings, play_game
from twenty_q.answerer_llm import AnswererConfig, OfflineAnswererLLM, make_answerer_llm
from twenty_q.flow import GAME_OVER, NEXT_TURN, TwentyQuestionsFlow
from twenty_q.state import Turn
from twenty_questions_helpers import PlainEndpoint, ScriptedOpenAIServer

NO_SEARCH = PlayerSettings(use_search=False)


def flow_with(**state: Any) -> TwentyQuestionsFlow:
    flow = TwentyQuestionsFlow(player_llm=None, answerer_llm=OfflineAnswererLLM(), use_search=False)
    for name, value in state.items():
        setattr(flow.state, name, value)
    return flow


@pytest.mark.parametrize(
    ("state", "route"),
    [
        ({"turn": 1}, NEXT_TURN),
        ({"turn": 19}, NEXT_TURN),
        ({"turn": 20}, GAME_OVER),
        ({"turn": 3, "guessed": True}, GAME_OVER),
        ({"turn": 5, "max_turns": 5}, GAME_OVER),
        ({"turn": 4, "max_turns": 5}, NEXT_TURN),
    ],
)
def test_routing(state: dict[str, Any], route: str) -> None:
    assert flow_with(**state).game_should_continue() == route


def test_the_graph_loops_back_to_ask_question_and_ends_in_finish_game() -> None:
    flow = flow_with()
    listeners = {name: str(condition) for name, condition in flow._listeners.items()}
    assert "ask_question" in flow._start_methods
    assert "answer_question" in listeners and "finish_game" in listeners
    assert "game_should_continue" in flow._routers


def test_answer_question_marks_a_non_question_as_wasted_without_asking() -> None:
    flow = flow_with(secret="penguin", category="animals", turn=1)
    flow.state.history.append(Turn(number=1, reply="hello there", question=None, wasted=True))
    flow.answer_question()
    assert flow.state.history[-1].answer is None and not flow.state.guessed
    assert flow.state.messages[-1]["content"].startswith("Not a yes/no question")


def test_a_scripted_player_wins_a_full_game() -> None:
    replies = [
        "Thought: broad first\nFinal Answer: Is it an animal?",
        "Final Answer: Is it a mammal?",
        "I am not sure what to ask",  # not a question: a wasted turn
        "Is it a bird?",
        "Thought: birds that swim\nFinal Answer: Does it live in the water?",
        "Final Answer: Is it a penguin?",
    ]
    with ScriptedOpenAIServer(replies) as server:
        state = play_game(
            {"secret": "penguin", "category": "animals"},
            PlainEndpoint(server.base_url),
            settings=NO_SEARCH,
            answerer=AnswererConfig(),
        )
    assert state.guessed and state.turn == 6
    assert [(t.question, t.answer) for t in state.history] == [
        ("Is it an animal?", "yes"),
        ("Is it a mammal?", "no"),
        (None, None),
        ("Is it a bird?", "yes"),
        ("Does it live in the water?", "yes"),
        ("Is it a penguin?", "yes"),
    ]
    assert state.history[2].wasted and state.answerer_errors == 0 and state.player_errors == 0
    # Every request carries the whole conversation: each prompt extends the previous one + its reply.
    bodies = [r["messages"] for r in server.requests]
    assert len(bodies) == 6
    for before, after, reply in zip(bodies, bodies[1:], replies, strict=False):
        assert after[: len(before)] == before
        assert after[len(before)] == {"role": "assistant", "content": reply}
    assert all(r["model"] == "scripted" for r in server.requests)


def test_a_player_that_never_asks_uses_up_twenty_turns() -> None:
    with ScriptedOpenAIServer(["cardboard floated whispered"]) as server:
        state = play_game(
            {"secret": "harp", "category": "instruments"}, PlainEndpoint(server.base_url), settings=NO_SEARCH
        )
    assert not state.guessed and state.turn == 20 and all(t.wasted for t in state.history)


def test_games_leave_no_crewai_token_counters_on_litellms_input_callbacks() -> None:
    """CrewAI 1.6.1 hands LiteLLM a new token counter with every call, and LiteLLM 1.106.2 keeps each one
    in `input_callback` and walks them all on every later call: a run's calls slowed as it went on."""
    import litellm
    from crewai.utilities.token_counter_callback import TokenCalcHandler

    def counters() -> int:
        return sum(isinstance(callback, TokenCalcHandler) for callback in litellm.input_callback)

    others = [callback for callback in litellm.input_callback if not isinstance(callback, TokenCalcHandler)]
    with ScriptedOpenAIServer(["Is it a bird?", "Is it a penguin?"]) as server:
        for _ in range(3):
            state = play_game(
                {"secret": "penguin", "category": "animals"}, PlainEndpoint(server.base_url), settings=NO_SEARCH
            )
            assert state.guessed and counters() == 0
    assert len(server.requests) >= 3, "every game's player called through LiteLLM"
    assert [c for c in litellm.input_callback if not isinstance(c, TokenCalcHandler)] == others


def test_a_failing_player_server_wastes_turns_but_the_game_ends() -> None:
    settings = PlayerSettings(use_search=False, max_turns=3)
    with ScriptedOpenAIServer(["Is it a penguin?"], status=400) as server:
        state = play_game(
            {"secret": "penguin", "category": "animals"}, PlainEndpoint(server.base_url), settings=settings
        )
    assert not state.guessed and state.turn == 3 and state.player_errors == 3


def test_a_missing_answerer_configuration_answers_na(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    config = AnswererConfig(model="openai/gpt-4o-mini")
    assert make_answerer_llm(config) is None
    assert make_answerer_llm(AnswererConfig(model="answerer", via_proxy=True), endpoint=None) is None
    settings = PlayerSettings(use_search=False, max_turns=2)
    with ScriptedOpenAIServer(["Is it a penguin?"]) as server:
        state = play_game(
            {"secret": "penguin", "category": "animals"},
            PlainEndpoint(server.base_url),
            settings=settings,
            answerer=config,
        )
    assert not state.guessed and state.turn == 2 and state.answerer_errors == 2
    assert [t.answer for t in state.history] == ["n/a", "n/a"] and all(t.wasted for t in state.history)


def test_the_search_tool_is_counted_and_answers_about_the_named_thing() -> None:
    replies = [
        'Thought: look it up\nAction: search\nAction Input: {"query": "penguin"}',
        "Thought: I know now\nFinal Answer: Is it a penguin?",
    ]
    with ScriptedOpenAIServer(replies) as server:
        state = play_game(
            {"secret": "penguin", "category": "animals"},
            PlainEndpoint(server.base_url),
            settings=PlayerSettings(use_search=True),
            answerer=AnswererConfig(),  # the offline answerer whatever TWENTYQ_ANSWERER_* say
        )
    assert state.guessed and state.turn == 1 and state.tool_calls == 1
    observation = str(server.requests[1]["messages"])
    assert "penguin (animals)" in observation and "lays eggs" in observation


def test_answers_do_not_wait_on_crewais_task_output_database() -> None:
    """CrewAI writes every crew's task outputs to one SQLite file; an answerer crew keeps them in memory, so a
    lock held on that file (dozens of concurrent games under load) costs no answer."""
    import sqlite3

    from crewai.memory.storage.kickoff_task_outputs_storage import KickoffTaskOutputsSQLiteStorage

    locker = sqlite3.connect(KickoffTaskOutputsSQLiteStorage().db_path, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        with ScriptedOpenAIServer(["Is it a bird?", "Is it a penguin?"]) as server:
            state = play_game(
                {"secret": "penguin", "category": "animals"},
                PlainEndpoint(server.base_url),
                settings=PlayerSettings(use_search=False, max_turns=2),
                answerer=AnswererConfig(),
            )
    finally:
        locker.rollback()
        locker.close()
    assert state.guessed and state.answerer_errors == 0
    assert [t.answer for t in state.history] == ["yes", "yes"]
