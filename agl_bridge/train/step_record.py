"""The record every training mode writes for a step, built in one place so the modes cannot drift:
the same keys in online, offline and follow runs (None where a mode has no such figure), plus the
fields a mode adds of its own.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from agl_bridge.convert import ConversionReport, Trajectory
from agl_bridge.train.advantages import AdvantageBatch
from agl_bridge.types import RolloutStatus

Marks = tuple[float, float, float, float, float]
"""A step's five `perf_counter` marks: start, sampled, converted (datums built), trained, synced."""


def reward_stats(trajectories: list[Trajectory]) -> dict[str, Any]:
    """Mean and std of the trajectories' returns, and the mean of each named reward (0 where one is absent)."""
    if not trajectories:
        return {"reward_mean": None, "reward_std": None}
    returns = [t.reward for t in trajectories]
    stats: dict[str, Any] = {"reward_mean": statistics.fmean(returns), "reward_std": statistics.pstdev(returns)}
    names = sorted({name for t in trajectories for name in t.rewards})
    for name in names:
        stats[f"reward_{name}_mean"] = statistics.fmean(t.rewards.get(name, 0.0) for t in trajectories)
    return stats


def step_times(marks: Marks, last_finished_at: float | None, weights_at: float) -> dict[str, Any]:
    """A training step's timings from its five `perf_counter` marks (start, sampled, converted, trained,
    synced), and `time_to_weights_s`: from the commit of the step's last finished rollout
    (`last_finished_at`, epoch seconds; None: no rollout) to its new weights serving (`weights_at`)."""
    t0, t1, t2, t3, t4 = marks
    return {
        "time_sample_s": round(t1 - t0, 4),
        "time_convert_s": round(t2 - t1, 4),
        "time_train_s": round(t3 - t2, 4),
        "time_sync_s": round(t4 - t3, 4),
        "time_step_s": round(t4 - t0, 4),
        "time_to_weights_s": None if last_finished_at is None else round(weights_at - last_finished_at, 4),
    }


def step_record(
    *,
    step: int,
    policy_version: int | None,
    trajectories: list[Trajectory],
    statuses: Sequence[RolloutStatus] | None,
    report: ConversionReport | None,
    batch: AdvantageBatch,
    datums: int,
    metrics: dict[str, Any],
    marks: Marks,
    last_finished_at: float | None,
    weights_at: float,
) -> dict[str, Any]:
    """A step's "train" record (`STEP_RECORD_KEYS`): its rewards, the rollouts it took (`statuses`;
    None: it ran none), what conversion dropped and trained by class (`report`; None: converted
    elsewhere), its groups, datums, the training metrics and the timings."""
    audit = (report or ConversionReport()).audit()
    t0, t1, _, _, t4 = marks
    return {
        "phase": "train",
        "step": step,
        "policy_version": policy_version,
        **reward_stats(trajectories),
        "rollouts": None if statuses is None else len(statuses),
        "rollouts_failed": None if statuses is None else sum(s is RolloutStatus.FAILED for s in statuses),
        "rollouts_timed_out": None if statuses is None else sum(s is RolloutStatus.TIMED_OUT for s in statuses),
        "trajectories": len(trajectories),
        "dropped": None if report is None else report.attempts_dropped,
        "dropped_by_reason": None if report is None else dict(report.dropped),
        "segments": sum(len(t.segments) for t in trajectories) if report is None else report.segments,
        **(audit if report is not None else dict.fromkeys(audit)),
        "groups": batch.groups,
        "groups_zero_variance": batch.groups_dropped_zero_variance,
        "datums": datums,
        **metrics,
        **step_times(marks, last_finished_at, weights_at),
        # the share of the step spent neither sampling nor in forward/backward + optim_step
        "overhead_share": round(
            ((t4 - t0) - (t1 - t0) - metrics.get("time_forward_backward_s", 0.0)) / max(t4 - t0, 1e-9), 4
        ),
    }


STEP_RECORD_KEYS: frozenset[str] = frozenset(
    step_record(
        step=0,
        policy_version=None,
        trajectories=[],
        statuses=None,
        report=None,
        batch=AdvantageBatch(),
        datums=0,
        metrics={},
        marks=(0.0, 0.0, 0.0, 0.0, 0.0),
        last_finished_at=None,
        weights_at=0.0,
    )
)
"""The keys of every mode's "train" record, besides the training metrics (`step.TRAIN_KEYS`) and a mode's own."""
