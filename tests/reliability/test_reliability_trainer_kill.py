"""kill -9 of the trainer in the middle of a step: `--resume` continues from the last checkpoint,
and over both runs every step's tasks are trained exactly once, none repeated, none skipped.

The interrupted run's rollouts that were still open are closed as failed on resume (never
trained); metrics.jsonl ends up with one record per step.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from shared_helpers import REPO, query

from agl_bridge.runner import TaskSchedule
from agl_bridge.testing.checks import integrity
from agl_bridge.testing.proxy_process import child_env

pytestmark = pytest.mark.slow

TOY_AGENT = """
def toy_agent(task, endpoint):
    client = endpoint.openai_client()
    reply = client.chat.completions.create(
        model=endpoint.model, messages=[{"role": "user", "content": f"Write about {task}."}], max_tokens=8,
    )
    return float(len(reply.choices[0].message.content or "") % 5)
"""
TASKS = ["cats", "dogs", "rain", "music", "bread", "ships", "trees", "stars"]
STEPS, BATCH, GROUP = 4, 3, 2


def _config(tmp_path: Path) -> Path:
    (tmp_path / "toy_agent.py").write_text(TOY_AGENT)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    config = {
        "agent": f"{tmp_path / 'toy_agent.py'}:toy_agent",
        "tasks": "tasks.jsonl",
        "run_dir": str(tmp_path / "run"),
        "steps": STEPS,
        "batch_size": BATCH,
        "group_size": GROUP,
        "checkpoint_every": 1,
        "eval_every": 100,
        "learning_rate": 1e-3,
        "default_max_tokens": 8,
        "tensorboard": False,
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(config))
    return path


def _train(config: Path, *extra: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "agl_bridge.cli", "train", "--config", str(config), *extra],
            stdout=out,
            stderr=out,
            env={**child_env(), "COLUMNS": "200"},
            cwd=REPO,
        )


def _rollouts_of_step(store: Path, step: int) -> int:
    try:
        return query(store, "SELECT count(*) FROM rollouts WHERE group_id LIKE ?", f"s{step}-%")[0][0]
    except sqlite3.Error:  # not created yet, or mid-creation
        return 0


def test_trainer_killed_mid_step_resumes_without_repeating_or_skipping(tmp_path: Path) -> None:
    config = _config(tmp_path)
    store = tmp_path / "run" / "store.sqlite"
    log = tmp_path / "train.log"
    first = _train(config, log=log)
    try:
        deadline = time.monotonic() + 300
        while _rollouts_of_step(store, 2) == 0:  # step 3 has started sampling
            assert first.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "step 3 never started"
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
    finally:
        if first.poll() is None:
            first.kill()
        first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL
    killed_at = query(store, "SELECT max(rowid) FROM rollouts")[0][0]
    assert integrity(store) == "ok"

    second = _train(config, "--resume", log=log)
    try:
        assert second.wait(timeout=400) == 0, log.read_text()[-3000:]
    finally:
        if second.poll() is None:
            second.kill()
            second.wait(timeout=60)
    text = log.read_text()
    resumed = re.search(r"resumed from \S*step_(\d+)", text)
    assert resumed is not None, text[-3000:]
    next_step = int(resumed[1])
    assert next_step >= 2

    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["phase"] == "train"] == list(range(1, STEPS + 1))

    schedule = TaskSchedule(TASKS, batch_size=BATCH, seed=0)
    rows = query(store, "SELECT rowid, group_id, task, status FROM rollouts ORDER BY rowid")
    assert not [r for r in rows if r[3] in ("running", "queued")], "the interrupted run's open rollouts are closed"
    for step in range(STEPS):
        trained_run = (lambda rowid: rowid <= killed_at) if step < next_step else (lambda rowid: rowid > killed_at)
        trained = sorted(
            json.loads(task)
            for rowid, group, task, status in rows
            if group.startswith(f"s{step}-") and trained_run(rowid) and status == "succeeded"
        )
        assert trained == sorted(schedule.for_step(step) * GROUP), f"step {step + 1}"
    interrupted = [r for r in rows if r[0] <= killed_at and int(r[1][1:].split("-")[0]) >= next_step]
    assert all(r[3] in ("failed", "succeeded") for r in interrupted)
    # A rollout killed while still queued never had an attempt: it is closed without one. Every
    # attempt the kill left running is closed as interrupted, and only those.
    assert query(store, "SELECT count(*) FROM attempts WHERE status = 'running'")[0][0] == 0
    interrupted_attempts = {
        r[0]
        for r in query(
            store,
            "SELECT rollouts.rowid FROM attempts JOIN rollouts USING (rollout_id)"
            " WHERE attempts.error LIKE 'interrupted:%'",
        )
    }
    assert interrupted_attempts <= {r[0] for r in interrupted if r[3] == "failed"}
    assert (tmp_path / "run" / "final_adapter").is_dir()
    assert integrity(store) == "ok"
    assert not any(os.path.exists(p) for p in (tmp_path / "run" / "checkpoints").glob("*/*.partial"))
