"""`convert_store`: stream a store's rollouts into trajectories, one rollout in memory at a time.

The store walks rollouts in one pass (`Store.iter_rollout_records(tokens_only=True)`: only
tokens train); each attempt goes through `convert_attempt`, and every attempt, call and reward
seen is counted in a `ConversionReport`. Which attempts train:
  - an attempt trains only if it succeeded AND its rollout is final: while a rollout is queued or
    running, its succeeded attempt counts as NOT_FINISHED (the runner may still record rewards
    for it); a rollout marked failed or timed_out trains none of its attempts (its verdict wins);
  - rewards recorded for the rollout outside any attempt belong to its last attempt (the one the
    rollout's outcome is about) and attach to no call; rewards naming an attempt the store has no
    row for are ignored (counted in `rewards_ignored`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

from agl_bridge import semconv
from agl_bridge.convert.policy import DEFAULT_OPTIONS, SKIP_CLASS, SKIP_NOT_SELECTED, SKIP_TEXT, ConvertOptions
from agl_bridge.convert.records import MAX_REPORT_WARNINGS, ConversionReport, DropReason, Trajectory
from agl_bridge.convert.trajectory import convert_attempt
from agl_bridge.export_files import closing_stream
from agl_bridge.store.base import Store
from agl_bridge.types import Attempt, AttemptRecords, AttemptStatus, Rollout, RolloutRecords, RolloutStatus

OUTSIDE_ATTEMPT = "outside_attempt"
"""`calls_not_trained` key: a rollout's calls made outside any of its attempts."""

DROPPED_ATTEMPT = "dropped_attempt"
"""`calls_not_trained` key: calls of an attempt that produced no trajectory."""

_ROLLOUT_VERDICTS = {RolloutStatus.FAILED: AttemptStatus.FAILED, RolloutStatus.TIMED_OUT: AttemptStatus.TIMED_OUT}


def effective_status(rollout: Rollout, attempt: Attempt) -> AttemptStatus:
    """The status `attempt` trains by: its own, unless its rollout is unfinished or failed (module doc)."""
    if attempt.status is not AttemptStatus.SUCCEEDED:
        return attempt.status
    if not rollout.status.is_final:
        return AttemptStatus.RUNNING
    return _ROLLOUT_VERDICTS.get(rollout.status, attempt.status)


def _count(counts: dict[str, int], key: str, n: int = 1) -> None:
    if n:
        counts[key] = counts.get(key, 0) + n


def convert_rollout(records: RolloutRecords, options: ConvertOptions, report: ConversionReport) -> list[Trajectory]:
    """Convert every attempt of one rollout; counts everything seen in `report`."""
    outcomes = convert_rollout_attempts(records, options, report)
    return [result for _, result in outcomes if isinstance(result, Trajectory)]


def convert_rollout_attempts(
    records: RolloutRecords, options: ConvertOptions, report: ConversionReport
) -> list[tuple[AttemptRecords, Trajectory | DropReason]]:
    """Each attempt of one rollout with what it became: its trajectory, or why it has none (see convert_rollout)."""
    rollout = records.rollout
    report.rollouts_seen += 1
    report.calls_seen += len(records.other_calls)
    _count(report.calls_not_trained, OUTSIDE_ATTEMPT, len(records.other_calls))
    rollout_level = [reward for reward in records.other_rewards if reward.attempt_id is None]
    report.rewards_seen += len(records.other_rewards)
    report.rewards_ignored += len(records.other_rewards) - (len(rollout_level) if records.attempts else 0)
    outcomes: list[tuple[AttemptRecords, Trajectory | DropReason]] = []
    for bundle in records.attempts:
        report.attempts_seen += 1
        report.calls_seen += len(bundle.calls)
        report.rewards_seen += len(bundle.rewards)
        rewards = bundle.rewards + rollout_level if rollout_level and bundle is records.attempts[-1] else bundle.rewards
        result = convert_attempt(
            bundle.calls,
            rewards,
            effective_status(rollout, bundle.attempt),
            options,
            rollout_id=rollout.rollout_id,
            attempt_id=bundle.attempt.attempt_id,
            group_id=rollout.group_id,
            task=rollout.task,
        )
        outcomes.append((bundle, result))
        if isinstance(result, DropReason):
            _count(report.dropped, result.value)
            _count(report.calls_not_trained, DROPPED_ATTEMPT, len(bundle.calls))
            continue
        report.attempts_converted += 1
        report.segments += len(result.segments)
        report.missing_reward_zeroed += result.missing_reward
        _audit(result, report)
        trained = result.num_calls
        report.calls_trained += trained
        if trained < len(bundle.calls):
            _count(
                report.calls_not_trained, SKIP_TEXT, sum(call.kind != semconv.CALL_KIND_TOKEN for call in bundle.calls)
            )
            for excluded in result.excluded_calls:
                reason = SKIP_CLASS if excluded.call_class not in options.train_classes else SKIP_NOT_SELECTED
                _count(report.calls_not_trained, reason)
    return outcomes


def _audit(trajectory: Trajectory, report: ConversionReport) -> None:
    """Count a converted trajectory's splits, calls by class and trained tokens by class (the provenance audit)."""
    by_class, tokens_by_class = report.calls_by_class, report.trained_tokens_by_class
    for segment in trajectory.segments:
        if segment.split_kind is not None:
            _count(report.splits, segment.split_kind.value)
        report.trained_tokens += sum(segment.loss_mask)
        for call in segment.calls:
            name = call.call_class.value if call.call_class is not None else "unclassified"
            _count(by_class, name)
            sampled = call.response_end - call.response_start  # the call's sampled ids, placed by merge
            _count(tokens_by_class, name, sampled)
            report.trained_sampled_tokens += sampled
    for excluded in trajectory.excluded_calls:
        _count(by_class, excluded.call_class.value)
        _count(report.excluded_by_class, excluded.call_class.value)
    if trajectory.graph_warnings:
        report.graph_warnings += len(trajectory.graph_warnings)
        room = MAX_REPORT_WARNINGS - len(report.warnings)
        where = f"rollout {trajectory.rollout_id} attempt {trajectory.attempt_id}: "
        report.warnings.extend(where + warning for warning in trajectory.graph_warnings[: max(room, 0)])


async def convert_store(
    store: Store,
    *,
    rollout_ids: Iterable[str] | None = None,
    options: ConvertOptions = DEFAULT_OPTIONS,
    report: ConversionReport | None = None,
) -> AsyncIterator[Trajectory]:
    """Stream the trajectories of a store (or of `rollout_ids`, in that order), rollout by rollout.

    Whole store: rollouts in rollout id order (creation order for store-made ids). Pass a
    `ConversionReport` to have it filled as the stream advances (complete once it is exhausted).
    Raises RolloutNotFoundError when an unknown id of `rollout_ids` is reached, and
    MissingRewardError under `missing_reward="error"`.
    """
    report = ConversionReport() if report is None else report
    async with closing_stream(store.iter_rollout_records(rollout_ids, tokens_only=True)) as stream:
        async for records in stream:
            for trajectory in convert_rollout(records, options, report):
                yield trajectory
