"""Which groups a follow trainer may take: the complete GRPO groups among the rollouts it has not taken.

A group is the not-yet-taken rollouts of one task (their `group_id`, the task id the harness
named). It is complete once `group_size` of them are finished (succeeded, failed or timed out:
failed ones count, they just train nothing) — it then takes the first `group_size` to finish —
or, with a `group_timeout_s`, once that long has passed since its first finished and at least
`min_group_size` are finished: it takes those, and its stragglers start a later group. A rollout
whose harness named no task is a group of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agl_bridge.types import Rollout


@dataclass(frozen=True)
class ReadyGroup:
    """A complete group: its finished rollouts, first finished first."""

    group_id: str
    rollouts: list[Rollout]


@dataclass(frozen=True)
class WaitingCounts:
    """What a waiting trainer has: rollouts still running, finished ones in incomplete groups, finished
    rollouts that name no task, and when the next group completes by its timeout (epoch seconds)."""

    running: int
    finished: int
    incomplete_groups: int
    unnamed: int
    next_timeout_at: float | None


def ready_groups(
    rollouts: Iterable[Rollout], group_size: int, min_group_size: int, group_timeout_s: float | None, now: float
) -> tuple[list[ReadyGroup], WaitingCounts]:
    """The complete groups among `rollouts` (not taken yet, not eval), oldest first, and what else there is."""
    groups: dict[str, list[Rollout]] = {}
    running = 0
    for rollout in rollouts:
        if rollout.status.is_final:
            groups.setdefault(rollout.group_id or rollout.rollout_id, []).append(rollout)
        else:
            running += 1
    ready: list[ReadyGroup] = []
    finished = incomplete = unnamed = 0
    next_timeout_at: float | None = None
    for group_id, members in groups.items():
        members.sort(key=lambda rollout: rollout.updated_at)
        if len(members) >= group_size:
            ready.append(ReadyGroup(group_id, members[:group_size]))
            continue
        if group_timeout_s is not None and len(members) >= min_group_size:
            due = members[0].updated_at + group_timeout_s
            if due <= now:
                ready.append(ReadyGroup(group_id, members))
                continue
            next_timeout_at = due if next_timeout_at is None else min(next_timeout_at, due)
        if members[0].group_id is None:
            unnamed += len(members)
        else:
            finished += len(members)
            incomplete += 1
    ready.sort(key=lambda group: group.rollouts[0].updated_at)
    return ready, WaitingCounts(running, finished, incomplete, unnamed, next_timeout_at)
