"""What the player is told, and how a question is read out of its reply."""

from __future__ import annotations

import re
from collections.abc import Sequence

PLAYER_ROLE = "Twenty Questions player"
PLAYER_GOAL = "Find the secret with as few yes/no questions as possible."
PLAYER_BACKSTORY = "You are a methodical Twenty Questions player."

# Kept short on purpose: every word is re-read on each of up to 20 turns (prompt tokens are the
# sampler's main cost on a CPU).
STRATEGY_GUIDE = """Strategy: go from broad to narrow; ask questions that split the candidates in half;
after "n/a", pivot to another property; guess with "Is it X?" when one candidate is left.
Ask one yes/no question per turn, ending with "?"."""


def opening_message(category: str, max_turns: int, candidates: Sequence[str] = ()) -> str:
    """The first user message of a game; `candidates`, when given, are numbered as the names the secret is among
    (a guess may name one by its number: `resolve_numbered_guess`)."""
    numbered = "; ".join(f"{number}. {name}" for number, name in enumerate(candidates, start=1))
    among = f'\nIt is one of: {numbered}.\nGuess one by its number: "Is it number 3?"' if candidates else ""
    return (
        f'Twenty Questions: I am thinking of something in the category "{category}". You have {max_turns} '
        f"yes/no questions; I answer yes, no or n/a.{among}\n{STRATEGY_GUIDE}\nYour first question?"
    )


def feedback_message(turn: int, max_turns: int, question: str | None, answer: str | None) -> str:
    """The user message after a turn: the answer (or why the turn was wasted) and the turns left."""
    left = max_turns - turn
    said = f"Answer: {answer}." if question is not None else "Not a yes/no question: turn wasted."
    return f"{said} {left} left. Next question?"


_FINAL = re.compile(r"final answer\s*:\s*(.*)", re.IGNORECASE | re.DOTALL)
# A period that ends a name just before the question mark ("Is it Martin Luther King Jr.?") stays in the sentence.
_SENTENCE = re.compile(r"(?:[^.!?\n]|\.(?=\S))*\?")
_WORD = re.compile(r"[A-Za-z]{2,}")


_NUMBERED_GUESS = re.compile(r"^is it (?:number|#) ?(\d+) ?\?$", re.IGNORECASE)


def resolve_numbered_guess(question: str, candidates: Sequence[str]) -> str:
    """A guess by list number ("Is it number 3?") as the answerer reads guesses: "Is it <the third name>?".

    Any other question, and a number outside the list, is returned as asked (the answerer says n/a to it).
    A tiny model knows no name it was not trained on, and copying a multi-token name out of the list is
    beyond it; a number is one token.
    """
    match = _NUMBERED_GUESS.match(question.strip())
    if match is None or not 1 <= int(match.group(1)) <= len(candidates):
        return question
    return f"Is it {candidates[int(match.group(1)) - 1]}?"


def extract_question(reply: str | None, candidates: Sequence[str] = ()) -> str | None:
    """The yes/no question in a player's reply, or None when there is none (a wasted turn); a guess of one of
    the listed `candidates` by its number is read as naming it (`resolve_numbered_guess`).

    CrewAI's ReAct format puts the answer after "Final Answer:"; free text is read as a whole. The
    first sentence that ends with "?" and has at least two words is the question.
    """
    if not reply:
        return None
    final = _FINAL.search(reply)
    text = final.group(1) if final else reply
    for candidate in _SENTENCE.findall(text):
        candidate = " ".join(candidate.split())
        if len(_WORD.findall(candidate)) >= 2 and len(candidate) <= 300:
            return resolve_numbered_guess(candidate, candidates)
    return None
