"""A game's reward: 1 for a found secret, less an optional cost per turn; 0 for a lost game."""

from __future__ import annotations

import os

from twenty_q.state import GameState


def check_turn_cost(turn_cost: float, max_turns: int) -> None:
    """Raise ValueError unless a game won on its last turn still earns more than 0 (held-out success counts a
    reward above 0 as a won game)."""
    if turn_cost < 0 or turn_cost * (max_turns - 1) >= 1:
        raise ValueError(
            f"turn cost {turn_cost} out of range: it must be at least 0 and below 1 / {max_turns - 1} "
            f"(games of {max_turns} turns), so that every won game earns more than a lost one (0)"
        )


def game_reward(state: GameState, turn_cost: float = 0.0) -> float:
    """0 if the game was lost; if won, 1 less `turn_cost` for every turn after the first.

    Why a cost: with 1 for any win, a game that repeats a number or asks a question it cannot use earns as
    much as a clean one whenever the secret is listed early, so only the late-listed groups tell them apart.
    """
    check_turn_cost(turn_cost, state.max_turns)
    return 1.0 - turn_cost * (state.turn - 1) if state.guessed else 0.0


def turn_cost_from_env() -> float:
    """TWENTYQ_TURN_COST: the reward's cost per turn (default 0: 1 for any won game)."""
    text = os.environ.get("TWENTYQ_TURN_COST") or "0"
    try:
        return float(text)
    except ValueError:
        raise ValueError(
            f"TWENTYQ_TURN_COST must be a number (the reward's cost per turn, e.g. 0.05), got {text!r}"
        ) from None
