"""Closing the attempts a dead process left open, so they end failed instead of "running" forever.

When a runner (or the trainer that holds it) is killed, the attempts it was running stay `running`
in the store. They are never trained on (only succeeded attempts of finished rollouts are), but a
store that says "running" about work nobody does is a lie the user has to clean up. A resumed run
calls `fail_interrupted` first: every running attempt becomes `failed` with the reason, and its
rollout (running or queued) `failed` too.
"""

from __future__ import annotations

from agl_bridge.store.base import Store
from agl_bridge.types import AttemptStatus, RolloutStatus


async def fail_interrupted(store: Store, reason: str) -> int:
    """Mark every running attempt failed with `reason`, and its unfinished rollout failed; return how many rollouts."""
    closed = 0
    for status in (RolloutStatus.RUNNING, RolloutStatus.QUEUED):
        for rollout in await store.list_rollouts(status=status):
            for attempt in await store.list_attempts(rollout.rollout_id):
                if attempt.status is AttemptStatus.RUNNING:
                    await store.finish_attempt(attempt.attempt_id, AttemptStatus.FAILED, error=reason)
            if status is RolloutStatus.QUEUED:
                # queued → failed is not a legal move; it passes through running, as a retry would.
                await store.set_rollout_status(rollout.rollout_id, RolloutStatus.RUNNING)
            await store.set_rollout_status(rollout.rollout_id, RolloutStatus.FAILED)
            closed += 1
    return closed
