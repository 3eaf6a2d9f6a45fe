"""Held-out evaluation, the same in every mode that has one: a rollout's return weighed as training
weighs it, and the "eval" (or "validation") record of a set of rollouts.

The online loop runs its held-out tasks itself (`online.evaluate_held_out`); the follow loop scores
the rollouts an outside harness marked `eval`. Both count rollouts that emitted no reward apart
(`eval_without_reward`), never as 0.
"""

from __future__ import annotations

import statistics
from typing import Any

from agl_bridge.convert.policy import ConvertOptions, weighted_return
from agl_bridge.store.base import Store

VALIDATION = "validation"
"""The split of the validation tasks: its records have phase "validation" and `validation_reward`."""


async def rollout_return(store: Store, rollout_id: str, options: ConvertOptions) -> float | None:
    """The rollout's rewards summed per name and weighed by the run's options; None if it emitted none."""
    totals: dict[str, float] = {}
    async for reward in store.iter_rewards(rollout_id):
        totals[reward.name] = totals.get(reward.name, 0.0) + reward.value
    return weighted_return(totals, options) if totals else None


def eval_record(
    returns: list[float], rollouts: int, *, step: int, seconds: float, stage: str = "rl", split: str = "held-out"
) -> dict[str, Any]:
    """The record of an evaluation over `rollouts` rollouts, `returns` of them with a reward."""
    phase = "validation" if split == VALIDATION else "eval"
    return {
        "phase": phase,
        "stage": stage,
        "step": step,
        f"{phase}_reward": statistics.fmean(returns) if returns else None,
        "eval_rollouts": rollouts,
        "eval_without_reward": rollouts - len(returns),
        "time_eval_s": round(seconds, 3),
    }
