"""The game's shared state: what the CrewAI Flow carries from turn to turn and what evaluation saves."""

from __future__ import annotations

from typing import Literal

from crewai.flow.flow import FlowState
from pydantic import BaseModel, Field

MAX_TURNS = 20


class Turn(BaseModel):
    """One turn: the player's raw reply, the question read from it (None: not a question), the answer."""

    number: int
    reply: str
    question: str | None = None
    answer: Literal["yes", "no", "n/a"] | None = None
    reason: str = ""
    wasted: bool = False


class GameState(FlowState):
    """The flow's state: the secret, the turn counter, the history, and how the game ended."""

    secret: str = ""
    category: str = ""
    # The names the secret is among, shown to the player when given (the learning setup, `learning.py`).
    candidates: list[str] = Field(default_factory=list)
    max_turns: int = Field(default=MAX_TURNS, ge=1, le=MAX_TURNS)
    turn: int = 0
    history: list[Turn] = Field(default_factory=list)
    guessed: bool = False
    tool_calls: int = 0
    answerer_errors: int = 0
    player_errors: int = 0
    # The player's conversation so far (system prompt excluded): it grows by exactly one assistant and
    # one user message per turn, so each prompt extends the previous prompt + reply token for token.
    messages: list[dict[str, str]] = Field(default_factory=list)

    @property
    def questions(self) -> list[str]:
        """The questions asked, in order (wasted turns left out)."""
        return [t.question for t in self.history if t.question]

    def summary(self) -> dict[str, object]:
        """The final state as plain data (one JSONL record of the evaluation)."""
        return self.model_dump(exclude={"messages"})
