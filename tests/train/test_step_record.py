"""The step record every training mode writes (`step_record`) and the reports it merges."""

from __future__ import annotations

from agl_bridge.convert import ConversionReport
from agl_bridge.convert.records import MAX_REPORT_WARNINGS, merged_reports
from agl_bridge.train.advantages import AdvantageBatch
from agl_bridge.train.step_record import STEP_RECORD_KEYS, step_record
from agl_bridge.types import RolloutStatus


def test_the_shared_keys_cover_what_each_mode_used_to_write_alone() -> None:
    online_only = {"rollouts_failed", "dropped_by_reason", "calls_by_class", "overhead_share", "segments"}
    offline_missing = {"policy_version", "rollouts", "time_sample_s", "time_train_s", "time_to_weights_s"}
    assert online_only | offline_missing | {"reward_mean", "groups_zero_variance", "datums"} <= STEP_RECORD_KEYS


def test_a_step_that_ran_no_rollouts_has_null_counts_and_the_same_keys() -> None:
    batch = AdvantageBatch(groups=2, groups_dropped_zero_variance=1)
    report = ConversionReport(dropped={"no_reward": 2}, segments=3)
    sampled = step_record(
        step=4,
        policy_version=7,
        trajectories=[],
        statuses=[RolloutStatus.SUCCEEDED, RolloutStatus.FAILED, RolloutStatus.TIMED_OUT],
        report=report,
        batch=batch,
        datums=0,
        metrics={"time_forward_backward_s": 1.0},
        marks=(0.0, 1.0, 2.0, 3.0, 4.0),
        last_finished_at=10.0,
        weights_at=12.5,
    )
    recorded = step_record(
        step=4,
        policy_version=None,
        trajectories=[],
        statuses=None,
        report=None,
        batch=batch,
        datums=0,
        metrics={},
        marks=(0.0, 0.0, 2.0, 3.0, 3.0),
        last_finished_at=None,
        weights_at=12.5,
    )
    assert recorded.keys() == STEP_RECORD_KEYS and sampled.keys() == STEP_RECORD_KEYS | {"time_forward_backward_s"}
    assert (sampled["rollouts"], sampled["rollouts_failed"], sampled["rollouts_timed_out"]) == (3, 1, 1)
    assert (sampled["dropped"], sampled["dropped_by_reason"], sampled["segments"]) == (2, {"no_reward": 2}, 3)
    assert sampled["time_to_weights_s"] == 2.5 and sampled["overhead_share"] == 0.5  # (4 - 1 - 1) / 4
    assert (recorded["rollouts"], recorded["dropped"], recorded["calls_by_class"]) == (None, None, None)
    assert recorded["time_to_weights_s"] is None and recorded["groups_zero_variance"] == 1


def test_merged_reports_add_up_every_count_and_keep_few_warnings() -> None:
    first = ConversionReport(attempts_converted=2, dropped={"failed": 1}, calls_by_class={"main": 3}, trained_tokens=10)
    second = ConversionReport(attempts_converted=1, dropped={"failed": 2, "no_reward": 1}, calls_by_class={"side": 1})
    first.warnings.extend(f"w{i}" for i in range(MAX_REPORT_WARNINGS))
    second.warnings.append("one more")
    total = merged_reports([first, second])
    assert total.attempts_converted == 3 and total.attempts_dropped == 4
    assert total.dropped == {"failed": 3, "no_reward": 1} and total.calls_by_class == {"main": 3, "side": 1}
    assert total.trained_tokens == 10 and len(total.warnings) == MAX_REPORT_WARNINGS
    assert first.dropped == {"failed": 1}, "the merged reports are left as they were"
