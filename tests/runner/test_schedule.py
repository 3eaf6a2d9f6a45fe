"""The task schedule: step k's tasks are a seeded function of k, each epoch covering the task set once."""

from __future__ import annotations

from agl_bridge.runner import TaskSchedule


def test_schedule_is_deterministic_and_covers_each_epoch_once() -> None:
    schedule = TaskSchedule(list(range(10)), batch_size=4, seed=3)
    steps = [schedule.for_step(k) for k in range(5)]  # 20 positions = exactly two epochs
    assert steps == [TaskSchedule(list(range(10)), 4, 3).for_step(k) for k in range(5)]
    flat = [t for step in steps for t in step]
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:]) == list(range(10))
    assert flat[:10] != flat[10:], "each epoch is shuffled anew"
    assert TaskSchedule(list(range(10)), 4, 4).for_step(0) != steps[0]
