"""The learning setup of the Twenty Questions example: the entity split, the candidate lists, and the
scripted player whose games are the warm-start data (played as the real CrewAI flow plays them)."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest
import twenty_questions_helpers  # noqa: F401  (puts the example on the import path)
from twenty_q.agent import PlayerSettings, play_game
from twenty_q.answerer import DeterministicAnswerer
from twenty_q.answerer_llm import AnswererConfig
from twenty_q.learning import (
    CANDIDATES,
    MAX_TURNS,
    held_out_tasks,
    learning_split,
    phase_tasks,
    position_balanced,
)
from twenty_q.prompts import extract_question, resolve_numbered_guess
from twenty_q.scripted import ScriptedPlayer, crewai_system_prompt, scripted_game, warm_start_games
from twenty_questions_helpers import PlainEndpoint, ScriptedOpenAIServer


def test_the_split_is_disjoint_and_held_out_names_never_reach_the_warm_start_or_rl() -> None:
    warm, rl, held_out = learning_split()
    names = [{e.name for e in part} for part in (warm, rl, held_out)]
    assert all(not a & b for i, a in enumerate(names) for b in names[i + 1 :])
    assert len(warm) == 96 and len(rl) == 64 and len(held_out) == 40
    assert learning_split() == (warm, rl, held_out), "fixed whatever the run"
    warm_start_names = {n for t in phase_tasks("warm_start", 4) for n in t["candidates"]}
    rl_names = {n for t in phase_tasks("rl", 4) for n in t["candidates"]}
    assert warm_start_names <= names[0]
    assert not rl_names & names[2] and {t["secret"] for t in phase_tasks("rl", 1)} == names[1]
    for task in phase_tasks("held_out", 2):
        assert task["secret"] in names[2] and task["secret"] in task["candidates"]
        assert len(set(task["candidates"])) == CANDIDATES


def test_rl_tasks_come_with_every_list_position_once_in_each_batch_of_eight() -> None:
    tasks = phase_tasks("rl", 5, seed=2)
    balanced = position_balanced(tasks, seed=2)
    positions = [t["candidates"].index(t["secret"]) + 1 for t in balanced]
    assert all(sorted(positions[i : i + CANDIDATES]) == list(range(1, 9)) for i in range(0, len(positions), 8))
    # The same games, only reordered and each secret moved to another place of its own list.
    assert sorted((t["secret"], sorted(t["candidates"])) for t in balanced) == sorted(
        (t["secret"], sorted(t["candidates"])) for t in tasks
    )
    assert balanced == position_balanced(tasks, seed=2) != position_balanced(tasks, seed=3)


def test_the_held_out_lists_put_the_secret_at_every_position_equally_often_whatever_the_seed() -> None:
    drawn, balanced = held_out_tasks(balanced=False), held_out_tasks()
    assert drawn == phase_tasks("held_out", 2) and balanced == held_out_tasks()
    positions = Counter(t["candidates"].index(t["secret"]) + 1 for t in balanced)
    assert positions == dict.fromkeys(range(1, CANDIDATES + 1), len(drawn) // CANDIDATES)
    assert Counter(t["secret"] for t in balanced) == Counter(t["secret"] for t in drawn)
    assert sorted(sorted(t["candidates"]) for t in balanced) == sorted(sorted(t["candidates"]) for t in drawn)


def test_the_real_flow_numbers_the_candidates_and_reads_a_guess_by_number_as_the_name() -> None:
    task = phase_tasks("held_out", 1)[0]
    candidates = list(task["candidates"])
    secret_number = candidates.index(task["secret"]) + 1
    wrong_number = 1 if secret_number != 1 else 2
    replies = [f"Is it number {wrong_number}?", "Is it number 99?", f"is it #{secret_number}?"]
    with ScriptedOpenAIServer(replies) as server:
        state = play_game(
            task, PlainEndpoint(server.base_url), settings=PlayerSettings(use_search=False, max_turns=MAX_TURNS)
        )
    opening = server.requests[0]["messages"][1]["content"]
    assert "It is one of: " + "; ".join(f"{i}. {name}" for i, name in enumerate(candidates, start=1)) in opening
    assert [(t.question, t.answer) for t in state.history] == [
        (f"Is it {candidates[wrong_number - 1]}?", "no"),
        ("Is it number 99?", "n/a"),  # not on the list: asked as is, and the answerer cannot read it
        (f"Is it {task['secret']}?", "yes"),
    ]
    assert state.guessed and state.turn == 3


@pytest.mark.parametrize(
    ("question", "read"),
    [
        ("Is it number 2?", "Is it cat?"),
        ("IS IT NUMBER 3 ?", "Is it penguin?"),
        ("Is it #1?", "Is it dog?"),
        ("Is it number 4?", "Is it number 4?"),
        ("Is it number 0?", "Is it number 0?"),
        ("Is it a number?", "Is it a number?"),
        ("Is it number 2 or 3?", "Is it number 2 or 3?"),
    ],
)
def test_a_guess_by_number_names_that_candidate_and_nothing_else_is_rewritten(question: str, read: str) -> None:
    assert resolve_numbered_guess(question, ["dog", "cat", "penguin"]) == read
    assert extract_question(f"Thought: ok\nFinal Answer: {question}", ["dog", "cat", "penguin"]) == read


@pytest.mark.slow
def test_a_scripted_game_sends_what_the_crewai_flow_sends() -> None:
    """The warm start trains on exactly the prompts the flow will build: same system prompt, same turns."""
    system = crewai_system_prompt()
    answerer = DeterministicAnswerer()
    settings = PlayerSettings(use_search=False, max_turns=MAX_TURNS)
    for task in phase_tasks("warm_start", 1)[:6]:
        turns, won = scripted_game(
            task, ScriptedPlayer(task["candidates"], random.Random(3), 0.5, MAX_TURNS), system, MAX_TURNS, answerer
        )
        with ScriptedOpenAIServer([reply for _, reply in turns]) as server:
            state = play_game(task, PlainEndpoint(server.base_url), settings=settings, answerer=AnswererConfig())
        assert [r["messages"] for r in server.requests] == [messages for messages, _ in turns]
        assert state.guessed == won and state.turn == len(turns)


def test_the_scripted_player_wins_every_game_within_the_turns_and_asks_only_answerable_questions() -> None:
    pairs, won = warm_start_games(phase_tasks("warm_start", 2), seed=0, question_rate=0.5, max_turns=MAX_TURNS)
    assert all(won) and len(won) == 192
    replies = [reply for _, reply in pairs]
    assert all(extract_question(reply) == reply for reply in replies)
    guesses = [r for r in replies if re.fullmatch(rf"Is it number [1-{CANDIDATES}]\?", r)]
    questions = [r for r in replies if r not in guesses]
    assert guesses and questions, "question_rate 0.5 asks questions and guesses by number"


def test_a_player_that_ignores_its_answers_guesses_through_the_list_in_order_and_only_won_games_are_kept() -> None:
    tasks = phase_tasks("warm_start", 1)
    pairs, won = warm_start_games(tasks, seed=0, question_rate=0.5, max_turns=MAX_TURNS, uses_answers=False)
    assert 0 < sum(won) < len(won), "questions cost turns: some games are lost"
    numbers_per_game: list[list[int]] = []
    for messages, reply in pairs:
        if len(messages) == 2:  # a game's first turn: the system prompt and the opening
            numbers_per_game.append([])
        if match := re.fullmatch(r"Is it number (\d)\?", reply):
            numbers_per_game[-1].append(int(match.group(1)))
    assert len(numbers_per_game) == sum(won)
    assert all(numbers == list(range(1, len(numbers) + 1)) for numbers in numbers_per_game)


def test_replaying_lost_lists_wins_the_late_list_positions_too() -> None:
    tasks = phase_tasks("warm_start", 1)
    once, won_once = warm_start_games(tasks, seed=0, question_rate=0.5, max_turns=MAX_TURNS, uses_answers=False)
    replayed, won = warm_start_games(
        tasks, seed=0, question_rate=0.5, max_turns=MAX_TURNS, uses_answers=False, tries=1000
    )
    assert len(won) == len(tasks) and all(won) and sum(won_once) < len(tasks)
    late = [reply for _, reply in replayed if reply in ("Is it number 7?", "Is it number 8?")]
    assert len(late) > sum(reply in ("Is it number 7?", "Is it number 8?") for _, reply in once)
    secrets_at_8 = [t for t in tasks if t["candidates"].index(t["secret"]) == CANDIDATES - 1]
    assert secrets_at_8 and "Is it number 8?" in {reply for _, reply in replayed}
    with pytest.raises(ValueError, match="tries"):
        warm_start_games(tasks, seed=0, question_rate=0.5, max_turns=MAX_TURNS, tries=0)


def test_a_list_lost_after_its_tries_is_won_by_a_game_without_questions_whose_second_half_is_kept() -> None:
    tasks = phase_tasks("warm_start", 1)
    secrets_at_8 = [t for t in tasks if t["candidates"].index(t["secret"]) == CANDIDATES - 1]
    lost, won_with_questions = warm_start_games(
        secrets_at_8, seed=0, question_rate=0.8, max_turns=MAX_TURNS, uses_answers=False, tries=3
    )
    pairs, won = warm_start_games(
        secrets_at_8,
        seed=0,
        question_rate=0.8,
        max_turns=MAX_TURNS,
        uses_answers=False,
        tries=3,
        then_without_questions=True,
    )
    assert secrets_at_8 and not any(won_with_questions) and not lost
    # Only the game's last four turns: a question-free first half would teach the student never to ask.
    assert all(won) and [reply for _, reply in pairs] == [f"Is it number {n}?" for n in range(5, 9)] * len(secrets_at_8)
    assert all(len(messages) == 2 + 2 * 4 for messages, _ in pairs[::4]), "each kept part starts at turn 5"


@pytest.mark.parametrize("steps", ["1", "2", "40"])
def test_learn_takes_runs_shorter_than_its_learning_rate_warm_up(steps: str) -> None:
    import learn

    config = learn.build_config(learn.parse_args(["--steps", steps]))
    config.validate()
    assert config.lr_warmup_steps < config.steps
