"""Which training step a rollout belongs to, read from its group id.

The GRPO loop runs step k (0-based) with the runner's group prefix `s{k}` and evaluations after
step n with `eval{n}-{stamp}`; the runner appends `-{task index}`. So `s3-1` is the second task of
the step the metrics log as step 4, and `eval4-81234567-0` the first held-out task evaluated after
it. Stores written by `serve` (no runner) have no such groups: their rollouts belong to no step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TRAIN_GROUP = re.compile(r"^s(\d+)-(\d+)$")
_EVAL_GROUP = re.compile(r"^(eval(\d+)-\d+)-(\d+)$")

TRAIN = "train"
EVAL = "eval"


@dataclass(frozen=True, slots=True)
class StepRef:
    """A group's place in a run: `kind` train or eval, `step` as metrics.jsonl numbers it, the task index."""

    kind: str
    step: int
    task_index: int


def step_of(group_id: str | None) -> StepRef | None:
    """The step a group id names, or None for groups the GRPO loop did not make."""
    if group_id is None:
        return None
    match = _TRAIN_GROUP.match(group_id)
    if match:
        return StepRef(TRAIN, int(match[1]) + 1, int(match[2]))
    match = _EVAL_GROUP.match(group_id)
    if match:
        return StepRef(EVAL, int(match[2]), int(match[3]))
    return None


def evaluation_of(group_id: str | None) -> str | None:
    """The evaluation a group belongs to, `eval{step}-{stamp}` (two evaluations of one step, such as those
    before and after a warm start, differ by their stamp), or None for a group that is not an evaluation's."""
    match = _EVAL_GROUP.match(group_id or "")
    return match[1] if match else None


def train_group_range(step: int) -> tuple[str, str]:
    """Bounds (low inclusive, high exclusive) of the group ids of training step `step` (metrics numbering).

    As a range, not a LIKE pattern, so SQLite answers it from the group index: every id of the
    step starts with `s{step-1}-`, and '.' sorts right after '-'.
    """
    prefix = f"s{step - 1}"
    return f"{prefix}-", f"{prefix}."
