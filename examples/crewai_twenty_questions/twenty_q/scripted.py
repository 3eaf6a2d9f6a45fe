"""The scripted player whose games make the warm-start data, written as the real CrewAI flow plays them.

The scripted player knows every bundled entity's attributes. Now and then (`question_rate`) it asks the
question that best splits the candidates still possible; otherwise it guesses the first of them, in the
order the opening message lists them. A student that imitates it on names it has never seen cannot use
the answers to its questions (it does not know what they say about those names): what helps it is to
guess through the list without skipping or repeating a name, which RL has to find.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from typing import Any

from twenty_q.answerer_llm import LocalLLM
from twenty_q.data import UNKNOWN, EntityTable, default_table

_QUESTION_FORMS = ("Is it a {}?", "Is it {}?", "Does it have {}?")


@functools.cache
def attribute_questions() -> dict[str, str]:
    """{attribute: a question the bundled answerer reads as asking about it}, for the attributes that have one
    (checked on every bundled entity once per process: it takes seconds)."""
    from twenty_q.answerer import DeterministicAnswerer

    table = default_table()
    answerer = DeterministicAnswerer(table)
    questions = {}
    for attribute in table.attribute_names:
        for form in _QUESTION_FORMS:
            question = form.format(attribute.replace("_", " "))
            if all(
                answerer.answer(e.name, question).yes_or_no == table.value(e.name, attribute) for e in table.entities
            ):
                questions[attribute] = question
                break
    return questions


class ScriptedPlayer:
    """One game's scripted player: `reply()` gives the next question, `observe(answer)` takes its answer.

    uses_answers: False makes a player that asks the same questions but ignores their answers, guessing
    through the list in order (what a student that does not know the names can imitate).
    """

    def __init__(
        self,
        candidates: Sequence[str],
        rng: random.Random,
        question_rate: float,
        max_turns: int,
        table: EntityTable | None = None,
        questions: dict[str, str] | None = None,
        uses_answers: bool = True,
    ) -> None:
        self.table = table or default_table()
        self.questions = questions if questions is not None else attribute_questions()
        self._attributes = sorted(self.questions)
        self.candidates = list(candidates)
        self.possible = list(candidates)
        self.rng = rng
        self.question_rate = question_rate
        self.turns_left = max_turns
        self._asked: tuple[str, str] | None = None  # (kind, attribute or name) of the last reply
        self.uses_answers = uses_answers

    def reply(self) -> str:
        """The next reply: a splitting question (when one helps and turns allow), else a guess."""
        self.turns_left -= 1
        split = self._best_split()
        if split is not None and self.turns_left >= len(self.possible) // 2 and self.rng.random() < self.question_rate:
            self._asked = ("question", split)
            return self.questions[split]
        self._asked = ("guess", self.possible[0])
        return f"Is it number {self.candidates.index(self.possible[0]) + 1}?"

    def observe(self, answer: str) -> None:
        """Drop the candidates the answer to the last reply rules out."""
        if self._asked is None:
            return
        kind, subject = self._asked
        if kind == "guess" and answer == "no":
            self.possible.remove(subject)
        elif kind == "question" and answer in ("yes", "no") and self.uses_answers:
            self.possible = [name for name in self.possible if self.table.value(name, subject) == answer]
        self._asked = None

    def _best_split(self) -> str | None:
        """The attribute that splits the possible candidates most evenly into yes and no (None if none splits)."""
        best: tuple[int, str] | None = None
        rows = [self.table.row(name) for name in self.possible]
        for attribute in self._attributes:
            values = [row.get(attribute, UNKNOWN) for row in rows]
            if UNKNOWN in values:
                continue
            smaller = min(values.count("yes"), values.count("no"))
            if smaller and (best is None or smaller > best[0]):
                best = (smaller, attribute)
        return best[1] if best else None


class _SystemPromptReader(LocalLLM):
    """A CrewAI LLM that keeps the first messages it is sent and guesses "dog", which ends a one-name game."""

    def __init__(self) -> None:
        super().__init__(model="twenty-questions-system-prompt-reader", temperature=0.0)
        self.first_messages: list[dict[str, Any]] = []

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
        """Keep the messages of the first call; reply with the winning guess."""
        self.first_messages = self.first_messages or [{"role": m["role"], "content": m["content"]} for m in messages]
        return "Is it dog?"


def crewai_system_prompt() -> dict[str, Any]:
    """The system message CrewAI gives the player (its version's wording), read off one real one-turn game."""
    from twenty_q.agent import PlayerSettings, play_game
    from twenty_q.answerer_llm import AnswererConfig

    reader = _SystemPromptReader()
    play_game(
        {"secret": "dog", "category": "animals", "candidates": ["dog"]},
        None,
        settings=PlayerSettings(use_search=False, max_turns=1),
        answerer=AnswererConfig(),
        player=reader,
    )
    system = reader.first_messages[0]
    if system["role"] != "system":
        raise RuntimeError(f"CrewAI's first player message is {system['role']!r}, not the system prompt")
    return system


def scripted_game(
    task: dict[str, Any], player: ScriptedPlayer, system: dict[str, Any], max_turns: int, answerer: Any
) -> tuple[list[tuple[list[dict[str, Any]], str]], bool]:
    """One game as the flow plays it (same messages, same answers), without CrewAI's per-turn cost:
    ((prompt messages, reply) of every turn, whether it was won)."""
    from twenty_q.prompts import extract_question, feedback_message, opening_message

    messages = [system, {"role": "user", "content": opening_message(task["category"], max_turns, task["candidates"])}]
    turns = []
    for turn in range(1, max_turns + 1):
        reply = player.reply()
        turns.append((list(messages), reply))
        question = extract_question(reply, task["candidates"])
        answer = answerer.answer(task["secret"], question) if question else None
        player.observe(answer.yes_or_no if answer else "n/a")
        messages += [
            {"role": "assistant", "content": reply},
            {
                "role": "user",
                "content": feedback_message(turn, max_turns, question, answer.yes_or_no if answer else None),
            },
        ]
        if answer is not None and answer.correct:
            return turns, True
    return turns, False


def warm_start_games(
    tasks: Sequence[dict[str, Any]],
    seed: int,
    question_rate: float,
    max_turns: int,
    table: EntityTable | None = None,
    uses_answers: bool = True,
    tries: int = 1,
    then_without_questions: bool = False,
) -> tuple[list[tuple[list[dict[str, Any]], str]], list[bool]]:
    """The scripted player's games on `tasks`: ((prompt messages, reply) of every turn of the games it won,
    whether each task's game was won).

    table: the entities the answerer and the player know (default: the bundled table); uses_answers: see
    `ScriptedPlayer`; tries: how many times a task is played until the player wins it (its questions drawn
    afresh each time). A player that ignores the answers wins a game whose secret is listed late only when it
    asks little, so with one try the won games rarely guess beyond number 5, and at a high question rate no
    number of tries wins the last positions (at 0.8 a secret listed eighth is won once in ~80,000 games);
    then_without_questions: a list still lost after its tries is played once more without a question, which
    guesses through the whole list and wins it, and that game's turns after the first `max_turns // 2` are
    kept: its last numbers teach counting to the list's end, where a question-free first half would teach the
    student not to ask at all (seed 2's warm start then won 0.91 of the held-out games, leaving RL no room).
    """
    if tries < 1:
        raise ValueError(f"tries must be at least 1, got {tries}")
    from twenty_q.answerer import DeterministicAnswerer

    rng = random.Random(seed)
    table = table or default_table()
    questions = attribute_questions()
    answerer = DeterministicAnswerer(table)
    system = crewai_system_prompt()
    pairs: list[tuple[list[dict[str, Any]], str]] = []
    won: list[bool] = []
    for task in tasks:
        rates = [question_rate] * tries + ([0.0] if then_without_questions else [])
        for rate in rates:
            player = ScriptedPlayer(task["candidates"], rng, rate, max_turns, table, questions, uses_answers)
            turns, guessed = scripted_game(task, player, system, max_turns, answerer)
            if guessed:
                break
        if guessed:
            pairs += turns[max_turns // 2 :] if rate == 0.0 < question_rate else turns
        won.append(guessed)
    return pairs, won
