"""Reward attribution: each reward goes to the latest trainable call recorded before it.

"Before" is the store-allocated sequence, never a clock: calls and rewards of one (rollout,
attempt) share a sequence space, and the proxy commits a call before returning it, so a reward
the agent emits after reading a response always has a higher sequence than that call (this is
Agent-lightning's rule, "the latest LLM call that ended before the reward"). Details:

  - Only trainable calls receive rewards; a reward after a text call or an unselected agent's call
    goes to the trainable call before those.
  - The n choices of one request share a sequence; a reward after them goes to the first trainable
    choice (choice 0 normally), the one that continues the conversation in place.
  - A reward recorded before any trainable call, or for the rollout outside any attempt (its
    sequence is from another space, so it cannot be ordered among the calls), is attached to no
    call: it counts in the trajectory's totals and return, and in `unattached_rewards`.
  - Several rewards of one name add up (per call and per trajectory).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from agl_bridge.types import LLMCall, Reward

CallKey = tuple[int, int]
"""(sequence, choice_index) of a call."""


@dataclass(slots=True)
class Attribution:
    """Rewards by call, the ones attached to no call, and the totals, each summed by name."""

    by_call: dict[CallKey, dict[str, float]] = field(default_factory=dict)
    unattached: dict[str, float] = field(default_factory=dict)
    totals: dict[str, float] = field(default_factory=dict)


def _add(into: dict[str, float], name: str, value: float) -> None:
    into[name] = into.get(name, 0.0) + value


def attribute_rewards(trainable: Sequence[LLMCall], rewards: Sequence[Reward]) -> Attribution:
    """Attribute `rewards` to `trainable` calls (both of one attempt; calls in sequence order).

    Rewards with `attempt_id` None are the rollout's own and attach to no call. Totals keep the
    names in the order the rewards were recorded.
    """
    receivers: list[LLMCall] = []  # the first trainable choice of each sequence, ascending
    for call in trainable:
        if not receivers or receivers[-1].sequence != call.sequence:
            receivers.append(call)
    # Sequences are store-allocated (never None on stored records); the casts only inform the type checker.
    sequences = [cast(int, call.sequence) for call in receivers]
    result = Attribution()
    for reward in sorted(rewards, key=_reward_order):
        _add(result.totals, reward.name, reward.value)
        index = -1 if reward.attempt_id is None else bisect_left(sequences, cast(int, reward.sequence)) - 1
        if index < 0:
            _add(result.unattached, reward.name, reward.value)
        else:
            call = receivers[index]
            _add(
                result.by_call.setdefault((cast(int, call.sequence), call.choice_index), {}), reward.name, reward.value
            )
    return result


def _reward_order(reward: Reward) -> tuple[int, int]:
    # Rollout-level rewards (no attempt) come first: their sequences are from another space.
    return (0, reward.sequence or 0) if reward.attempt_id is None else (1, reward.sequence or 0)
