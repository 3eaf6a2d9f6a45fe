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


def test_an_unshuffled_schedule_takes_the_tasks_in_their_order_every_epoch() -> None:
    schedule = TaskSchedule(list(range(6)), batch_size=4, seed=3, shuffle=False)
    assert [schedule.for_step(k) for k in range(3)] == [[0, 1, 2, 3], [4, 5, 0, 1], [2, 3, 4, 5]]


def test_the_trainer_schedules_its_tasks_in_order_with_shuffle_tasks_off(tmp_path) -> None:
    from agl_bridge.train.config import config_from_dict
    from agl_bridge.train.grpo import GRPOTrainer

    tasks = [{"n": n} for n in range(6)]
    assert TaskSchedule(tasks, 2, 0).for_step(0) != tasks[:2]
    for shuffle, first_step in ((False, tasks[:2]), (True, TaskSchedule(tasks, 2, 0).for_step(0))):
        config = config_from_dict({"run_dir": str(tmp_path), "shuffle_tasks": shuffle, "batch_size": 2, "seed": 0})
        trainer = GRPOTrainer(config, agent=lambda task, base_url: None, tasks=tasks)
        assert trainer.schedule.for_step(0) == first_step
