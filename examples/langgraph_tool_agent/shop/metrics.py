"""The held-out evaluations of a training run, read back from its store.

The trainer runs every evaluation's rollouts with the group id "eval<step>-<nonce>-<task>"; each is one
episode. Per evaluation: success (the episode's reward), the model turns (its recorded token calls) and how
many of them were well-formed (`outcome.well_formed` on the text the proxy recorded), the tools each episode
called, and the outcomes' reasons (the `shop.episode` span the agent recorded).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from shop.outcome import well_formed
from shop.telemetry import EPISODE_SPAN

NO_OUTCOME = "no outcome recorded"
"""The reason of an episode without an outcome span (it failed before it ended, or its span was lost)."""


@dataclass(frozen=True)
class HeldOutRun:
    """One held-out evaluation: episodes, success rate, well-formed share of model turns, mean turns per episode,
    share of episodes that called both tools, and how many episodes ended for each reason."""

    episodes: int
    success_rate: float
    well_formed_rate: float
    turns_mean: float
    both_tools_rate: float
    reasons: dict[str, int] = field(default_factory=dict)


@dataclass
class _Episode:
    won: bool
    turns: int
    well_formed_turns: int
    reason: str
    tools: frozenset[str]


def summarise(episodes: list[_Episode]) -> HeldOutRun:
    """The figures of one evaluation's episodes."""
    turns = sum(e.turns for e in episodes)
    return HeldOutRun(
        episodes=len(episodes),
        success_rate=sum(e.won for e in episodes) / len(episodes),
        well_formed_rate=sum(e.well_formed_turns for e in episodes) / turns if turns else 0.0,
        turns_mean=turns / len(episodes),
        both_tools_rate=sum(e.tools >= {"lookup_price", "order_total"} for e in episodes) / len(episodes),
        reasons=dict(Counter(e.reason for e in episodes)),
    )


async def held_out_evaluations(store_path: Path) -> list[HeldOutRun]:
    """Every held-out evaluation of the run whose store is at `store_path`, in the order they ran."""
    from agl_bridge.store.sqlite import SQLiteStore
    from agl_bridge.viewer.steps import evaluation_of

    runs: dict[str, list[_Episode]] = {}
    async with SQLiteStore(store_path) as store:
        for rollout in await store.list_rollouts():
            evaluation = evaluation_of(rollout.group_id)
            if evaluation is None:
                continue
            rewards = [r.value async for r in store.iter_rewards(rollout.rollout_id)]
            texts = [c.response_text or "" async for c in store.iter_llm_calls(rollout.rollout_id) if c.kind == "token"]
            spans = [s async for s in store.iter_spans(rollout.rollout_id) if s.name == EPISODE_SPAN]
            attributes = spans[-1].attributes if spans else {}
            runs.setdefault(evaluation, []).append(
                _Episode(
                    won=sum(rewards) > 0,
                    turns=len(texts),
                    well_formed_turns=sum(well_formed(text) for text in texts),
                    reason=str(attributes.get("shop.reason", NO_OUTCOME)),
                    tools=frozenset(attributes.get("shop.tool_calls") or ()),
                )
            )
    return [summarise(episodes) for episodes in runs.values()]
