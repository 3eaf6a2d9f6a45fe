"""The deterministic answerer: free-text yes/no questions answered from the attribute table.

A question is first read as a guess ("Is it a penguin?", "Are you thinking of Batman?"): naming the
secret or one of its aliases wins (`correct`), naming another bundled entity is a "no". Otherwise
the lexicon finds the attribute the question asks about and the table answers; a question that
matches nothing, or asks only about things that do not apply to the secret ("Does it have fur?"
about a chair, "Is it red?" about a stapler), gets "n/a".
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field

from twenty_q.data import EntityTable, default_table
from twenty_q.lexicon import matches, normalize


class AnswererResponse(BaseModel):
    """The answerer's structured output (the same shape a hosted model is asked for)."""

    brief_reason: str = Field(default="", description="One short sentence saying why; never reveal the secret.")
    yes_or_no: Literal["yes", "no", "n/a"] = Field(
        description="yes, no, or n/a when the question does not apply or is unclear."
    )
    correct: bool = Field(default=False, description="True only when the question names the secret (a correct guess).")


_GUESS = re.compile(
    r"^(?:so |then |ok |okay |well )?(?:is it|is this|is that|is the answer|is the secret|is the secret word|"
    r"are you thinking of|are you|could it be|can it be|would it be|might it be|it is|it s|my guess is|i guess|"
    r"i think it is|i think its|is he|is she|are they|the answer is|guess)\s+(?:a |an |the |called |named )?(.+?)$"
)


def guessed_name(question: str) -> str | None:
    """The normalized name a question guesses ("Is it a polar bear?" → "polar bear"), or None."""
    text = normalize(question)
    match = _GUESS.match(text)
    return match.group(1).strip() if match else None


class DeterministicAnswerer:
    """Answers questions about a secret from an `EntityTable` (the bundled one by default)."""

    def __init__(self, table: EntityTable | None = None) -> None:
        self.table = table or default_table()
        self._names = {normalize(n): e.name for e in self.table.entities for n in e.names}

    def answer(self, secret: str, question: str) -> AnswererResponse:
        """The answer to one question about `secret` (a name in the table)."""
        entity = self.table.get(secret)
        if entity is None:
            return AnswererResponse(brief_reason="I do not know that secret.", yes_or_no="n/a")
        guess = guessed_name(question)
        if guess is not None:
            named = self._names.get(guess)
            if named is not None:
                if named == entity.name:
                    return AnswererResponse(brief_reason="That is exactly it.", yes_or_no="yes", correct=True)
                return AnswererResponse(brief_reason="That is not what I am thinking of.", yes_or_no="no")
        for _, rule in matches(question):
            for attribute in rule.attributes:
                negated = attribute.startswith("!")
                value = self.table.value(entity.name, attribute.lstrip("!"))
                if value == "n/a":
                    continue
                if negated:
                    value = "no" if value == "yes" else "yes"
                return AnswererResponse(
                    brief_reason=f"Looked up {attribute.lstrip('!').replace('_', ' ')!r}.", yes_or_no=value
                )
        return AnswererResponse(brief_reason="The question does not apply or is unclear.", yes_or_no="n/a")
