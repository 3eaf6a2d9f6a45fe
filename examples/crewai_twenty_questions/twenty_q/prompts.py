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
    """The first user message of a game; `candidates`, when given, are listed as the names the secret is among."""
    among = f"\nIt is one of: {', '.join(candidates)}." if candidates else ""
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


def extract_question(reply: str | None) -> str | None:
    """The yes/no question in a player's reply, or None when there is none (a wasted turn).

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
            return candidate
    return None
