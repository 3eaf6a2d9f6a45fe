"""The agent entry point: one game per rollout, `emit_reward(game_reward(...))` at the end: 1 for a found
secret (less a cost per turn when `TWENTYQ_TURN_COST` sets one), 0 for a lost game.

This is all agl_bridge needs: the player's LLM points at `endpoint.base_url`, and the reward is
emitted when the flow ends. `play_game` is the same game without the reward, for evaluation against
any OpenAI-compatible model.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from crewai import LLM

from agl_bridge import emit_reward
from twenty_q.answerer_llm import AnswererConfig, make_answerer_llm
from twenty_q.data import default_table
from twenty_q.flow import TwentyQuestionsFlow
from twenty_q.litellm_callbacks import forget_crewai_token_counters
from twenty_q.reward import game_reward, turn_cost_from_env
from twenty_q.state import MAX_TURNS, GameState
from twenty_q.tracing import enable_crewai_tracing

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlayerSettings:
    """The player's settings: small replies (one question per turn), the search tool off by default.

    The tool is optional: its description and CrewAI's tool-use format add ~285 tokens to every
    prompt of every turn (464 instead of 179 for the system prompt with the tiny model's tokenizer),
    which on a CPU is a quarter of the sampling time. `TWENTYQ_SEARCH=1` / `--search` turns it on.
    """

    max_tokens: int = 32
    temperature: float = 1.0
    use_search: bool = False
    max_turns: int = MAX_TURNS

    @classmethod
    def from_env(cls) -> PlayerSettings:
        """TWENTYQ_MAX_TOKENS / TWENTYQ_TEMPERATURE / TWENTYQ_SEARCH (1 gives the player the tool) /
        TWENTYQ_MAX_TURNS."""
        env = os.environ
        return cls(
            max_tokens=int(env.get("TWENTYQ_MAX_TOKENS") or cls.max_tokens),
            temperature=float(env.get("TWENTYQ_TEMPERATURE") or cls.temperature),
            use_search=(env.get("TWENTYQ_SEARCH") or "0").lower() in ("1", "true", "yes"),
            max_turns=min(MAX_TURNS, int(env.get("TWENTYQ_MAX_TURNS") or MAX_TURNS)),
        )


SETTINGS = PlayerSettings()


def player_llm(endpoint: Any, settings: PlayerSettings = SETTINGS) -> LLM:
    """The trainable player's CrewAI LLM, pointed at the endpoint (the proxy or any OpenAI-compatible server)."""
    return LLM(
        model=f"openai/{endpoint.model}",
        base_url=endpoint.base_url,
        api_key=endpoint.api_key,
        max_tokens=settings.max_tokens,
        temperature=settings.temperature,
    )


def task_fields(task: Any) -> tuple[str, str, list[str]]:
    """(secret, category, candidates) of a task: {"secret", "category", optional "candidates"} or a bare name."""
    candidates: list[str] = []
    if isinstance(task, dict):
        secret = str(task.get("secret") or task.get("name") or "").strip()
        category = str(task.get("category") or "").strip()
        candidates = [str(name) for name in task.get("candidates") or []]
    else:
        secret, category = str(task).strip(), ""
    if not category:
        entity = default_table().get(secret)
        category = entity.category if entity is not None else "things"
    return secret, category, candidates


def play_game(
    task: Any,
    endpoint: Any,
    *,
    settings: PlayerSettings | None = None,
    answerer: AnswererConfig | None = None,
    player: Any = None,
) -> GameState:
    """Play one game and return its final state; `player` overrides the player's LLM (tests).

    settings: default `PlayerSettings.from_env()`; answerer: default `AnswererConfig.from_env()`.
    """
    settings = settings or PlayerSettings.from_env()
    secret, category, candidates = task_fields(task)
    flow = TwentyQuestionsFlow(
        player if player is not None else player_llm(endpoint, settings),
        make_answerer_llm(answerer or AnswererConfig.from_env(), endpoint),
        use_search=settings.use_search,
    )
    try:
        flow.kickoff(
            inputs={"secret": secret, "category": category, "candidates": candidates, "max_turns": settings.max_turns}
        )
    finally:
        forget_crewai_token_counters()
    return flow.state


def twenty_questions_agent(task: Any, endpoint: Any) -> None:
    """The rollout: trace CrewAI into the rollout, play, emit the reward (`game_reward`)."""
    tracing = enable_crewai_tracing(endpoint)
    state = play_game(task, endpoint)
    emit_reward(game_reward(state, turn_cost_from_env()))
    if tracing is not None:
        tracing.force_flush(5_000)  # the game's spans reach the proxy before the rollout is converted
