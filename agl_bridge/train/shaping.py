"""Rewards the trainer adds: DAPO's soft overlong penalty, an n-gram repetition penalty, and the way
any trainer-made reward (these, the judge's) joins a trajectory and the store.

Each penalty is a named reward ("overlong", "repetition") computed from the tokens the policy sampled in a
trajectory, so it is stored, logged (`reward_overlong_mean`, ...) and weighed (`reward_weights`)
like any reward the agent emits. Both are 0 for a trajectory that does nothing wrong and reach −1
at worst.
"""

from __future__ import annotations

from collections.abc import Iterable

from agl_bridge.convert import ConvertOptions, Trajectory
from agl_bridge.convert.policy import weighted_return
from agl_bridge.store.base import Store
from agl_bridge.train.config import OverlongPenaltyConfig, RepetitionPenaltyConfig
from agl_bridge.types import Reward

OVERLONG = "overlong"
REPETITION = "repetition"


def sampled_responses(trajectory: Trajectory) -> list[list[int]]:
    """The token ids of every response the policy sampled in `trajectory`, call by call."""
    return [
        segment.input_ids[call.response_start : call.response_end]
        for segment in trajectory.segments
        for call in segment.calls
    ]


def overlong_penalty(length: int, config: OverlongPenaltyConfig) -> float:
    """DAPO's soft overlong penalty of a response of `length` tokens: 0, then linear down to −1 at max_tokens."""
    free = config.max_tokens - config.buffer
    if length <= free:
        return 0.0
    if length > config.max_tokens:
        return -1.0
    return (free - length) / config.buffer


def repetition_penalty(responses: Iterable[list[int]], config: RepetitionPenaltyConfig) -> float:
    """−(redundancy − threshold) / (1 − threshold) above the threshold, else 0; redundancy = 1 − distinct / total
    n-grams, counted within each response (an n-gram never spans two calls)."""
    grams = [
        tuple(response[start : start + config.ngram])
        for response in responses
        for start in range(len(response) - config.ngram + 1)
    ]
    if not grams:
        return 0.0
    redundancy = 1.0 - len(set(grams)) / len(grams)
    if redundancy <= config.threshold:
        return 0.0
    return -(redundancy - config.threshold) / (1.0 - config.threshold)


def shaping_rewards(
    trajectory: Trajectory,
    overlong: OverlongPenaltyConfig | None,
    repetition: RepetitionPenaltyConfig | None,
) -> dict[str, float]:
    """The shaping rewards the config asks for, by name, for one trajectory."""
    responses = sampled_responses(trajectory)
    rewards: dict[str, float] = {}
    if overlong is not None:
        rewards[OVERLONG] = overlong_penalty(sum(map(len, responses)), overlong)
    if repetition is not None:
        rewards[REPETITION] = repetition_penalty(responses, repetition)
    return rewards


async def add_rewards(
    added: Iterable[tuple[Trajectory, dict[str, float]]], options: ConvertOptions, store: Store | None = None
) -> None:
    """Add named rewards the trainer computed to each trajectory's rewards and (weighted) return; store them.

    In the store each becomes a `Reward` of the trajectory's attempt (after its calls, so it is
    attributed to the last one): `inspect`, the viewer and a later conversion see it like any other.
    """
    added = list(added)
    if store is not None:
        records = [
            Reward(rollout_id=t.rollout_id, attempt_id=t.attempt_id, value=value, name=name)
            for t, rewards in added
            for name, value in rewards.items()
        ]
        if records:
            await store.add_rewards(records)
    for trajectory, rewards in added:
        for name, value in rewards.items():
            trajectory.rewards[name] = trajectory.rewards.get(name, 0.0) + value
        if rewards:
            trajectory.missing_reward = False
            trajectory.reward += weighted_return(rewards, options)
