"""The pieces that make a resumed run clean, checked directly (the kill test hits them at random points).

- `drop_records_after`: a run killed after logging step k but before checkpointing it leaves a
  record (and maybe a torn line) that the resumed run would duplicate.
- `fail_interrupted`: the attempts a dead run left open end failed, their rollouts too.
"""

from __future__ import annotations

import json
from pathlib import Path

from agl_bridge.runner.recovery import fail_interrupted
from agl_bridge.store import SQLiteStore
from agl_bridge.train.run_log import RunLog, drop_records_after, read_metrics
from agl_bridge.types import AttemptStatus, RolloutStatus


def test_records_after_the_checkpoint_and_a_torn_line_are_dropped_and_logging_goes_on(tmp_path: Path) -> None:
    log = RunLog(tmp_path, tensorboard=False)
    try:
        for step in (1, 2, 3):
            log.write({"phase": "train", "step": step})
        log.write({"phase": "eval", "step": 3, "eval_reward": 0.5})
        with (tmp_path / "metrics.jsonl").open("a") as file:
            file.write('{"phase": "train", "st')  # a kill mid-write
        assert drop_records_after(tmp_path, 2) == 3
        log.write({"phase": "train", "step": 3})  # the resumed run, appending through the open log
    finally:
        log.close()
    assert [(r["phase"], r["step"]) for r in read_metrics(tmp_path)] == [("train", 1), ("train", 2), ("train", 3)]
    assert all(json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines())
    assert drop_records_after(tmp_path / "nowhere", 1) == 0


async def test_open_rollouts_of_a_dead_run_end_failed(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "s.sqlite") as store:
        done = await store.create_rollout("done")
        attempt = await store.start_attempt(done.rollout_id)
        await store.finish_attempt(attempt.attempt_id, AttemptStatus.SUCCEEDED)
        await store.set_rollout_status(done.rollout_id, RolloutStatus.SUCCEEDED)
        running = await store.create_rollout("running")
        open_attempt = await store.start_attempt(running.rollout_id)
        queued = await store.create_rollout("queued")

        assert await fail_interrupted(store, "interrupted: test") == 2
        assert (await store.get_rollout(done.rollout_id)).status is RolloutStatus.SUCCEEDED
        for rollout in (running, queued):
            assert (await store.get_rollout(rollout.rollout_id)).status is RolloutStatus.FAILED
        closed = await store.get_attempt(open_attempt.attempt_id)
        assert closed.status is AttemptStatus.FAILED and closed.error == "interrupted: test"
        assert await fail_interrupted(store, "again") == 0
