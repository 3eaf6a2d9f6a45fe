"""The GRPO loop end to end, in subprocesses (a process holds one proxy): it learns, and it resumes.

The toy task rewards longer tokens (characters per sampled token); a random model has plenty of
variance there, so GRPO must raise the reward within 30 steps. How long steps take is measured in
bench/, not here: a loaded machine makes them slower, not wrong, so no subprocess gets a time limit.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agl_bridge.runner import TaskSchedule
from agl_bridge.train.step import TRAIN_KEYS
from agl_bridge.train.step_record import STEP_RECORD_KEYS

pytestmark = pytest.mark.slow

TOY_AGENT = """
def toy_agent(task, endpoint):
    client = endpoint.openai_client()
    reply = client.chat.completions.create(
        model=endpoint.model,
        messages=[{"role": "user", "content": f"Write something about {task}."}],
        max_tokens=8,
        extra_body={"return_token_ids": True},
    )
    ids = reply.choices[0].model_extra["token_ids"]
    return len(reply.choices[0].message.content or "") / max(1, len(ids))
"""
TASKS = ["cats", "dogs", "rain", "music", "bread", "ships", "trees", "stars"]


def _write_run(tmp_path: Path, agent_source: str = TOY_AGENT, **settings: object) -> Path:
    """Write a run config whose agent is `agent_source` (which must define `toy_agent`)."""
    (tmp_path / "toy_agent.py").write_text(agent_source)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    config = {
        "agent": f"{tmp_path / 'toy_agent.py'}:toy_agent",
        "tasks": "tasks.jsonl",
        "run_dir": str(tmp_path / "run"),
        "batch_size": 4,
        "group_size": 4,
        "learning_rate": 3e-3,
        "aggregation": "token_mean",
        "default_max_tokens": 8,
        "tensorboard": False,
        **settings,
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(config))
    return path


def _train(config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "agl_bridge.cli", "train", "--config", str(config), *extra]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _train_records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["phase"] == "train"]


def test_toy_reward_goes_up_within_thirty_steps(tmp_path: Path) -> None:
    config = _write_run(tmp_path, steps=30, eval_every=100, checkpoint_every=100, learning_rate=1e-2)
    _train(config)
    records = _train_records(tmp_path / "run")
    rewards = [r["reward_mean"] for r in records]
    assert [r["step"] for r in records] == list(range(1, 31))
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.5, rewards
    first = records[0]
    assert abs(first["ratio_mean"] - 1.0) < 1e-3, "the first on-policy step sees ratio 1"
    assert first["logprob_diff_abs_max"] < 1e-3
    trained_steps = 0
    for record in records:  # one live weight sync per step that had something to train
        trained_steps += record["datums"] > 0
        assert record["policy_version"] == trained_steps
    assert (tmp_path / "run" / "final_adapter").is_dir() and (tmp_path / "run" / "reward_curve.png").is_file()
    assert all(STEP_RECORD_KEYS.union(TRAIN_KEYS) <= r.keys() for r in records)


def test_each_step_trains_at_its_scheduled_learning_rate(tmp_path: Path) -> None:
    config = _write_run(
        tmp_path, steps=4, eval_every=100, checkpoint_every=100, lr_schedule="linear", lr_warmup_steps=1
    )
    _train(config)
    rates = {r["step"]: r["lr"] for r in _train_records(tmp_path / "run") if r["datums"]}
    expected = {1: 3e-3, 2: 3e-3, 3: 2e-3, 4: 1e-3}  # one warm-up step, then linear towards 0 over three
    assert rates and all(rates[step] == pytest.approx(expected[step]) for step in rates), rates


def test_resume_continues_without_repeating_or_skipping_tasks(tmp_path: Path) -> None:
    config = _write_run(tmp_path, steps=2, checkpoint_every=1, eval_every=100, batch_size=3, group_size=2)
    _train(config)
    config.write_text(json.dumps({**json.loads(config.read_text()), "steps": 4}))
    resumed = _train(config, "--resume")
    assert "resumed from" in resumed.stderr and "step_000002" in resumed.stderr
    assert [r["step"] for r in _train_records(tmp_path / "run")] == [1, 2, 3, 4]

    with sqlite3.connect(tmp_path / "run" / "store.sqlite") as db:
        rows = db.execute("SELECT group_id, task FROM rollouts ORDER BY created_at").fetchall()
    schedule = TaskSchedule(TASKS, batch_size=3, seed=0)
    for step in range(4):
        tasks = sorted(json.loads(task) for group, task in rows if group.startswith(f"s{step}-"))
        assert tasks == sorted(schedule.for_step(step) * 2), f"step {step}"


# The toy agent, except on validation tasks: their reward is 1 at the evaluation after step 1 only (each call
# claims the next number of its task atomically), so the adapter kept is step 1's, not the last one.
VALIDATED_TOY_AGENT = (
    TOY_AGENT.replace("def toy_agent(", "def _toy(")
    + """
import os
VALIDATION = {"clouds", "rivers", "songs"}


def toy_agent(task, endpoint):
    if task not in VALIDATION:
        return _toy(task, endpoint)
    _toy(task, endpoint)
    call = 0
    while True:
        try:
            os.close(os.open(os.path.join(os.environ["TOY_CALLS"], f"{task}-{call}"), os.O_CREAT | os.O_EXCL))
            break
        except FileExistsError:
            call += 1
    return 1.0 if call // 2 == 1 else 0.0  # two rollouts per task and evaluation: evaluation 1 is after step 1
"""
)


def test_keep_best_ends_with_the_adapter_of_the_best_validation_reward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "validation.jsonl").write_text("".join(json.dumps(t) + "\n" for t in ["clouds", "rivers", "songs"]))
    (tmp_path / "calls").mkdir()
    monkeypatch.setenv("TOY_CALLS", str(tmp_path / "calls"))
    config = _write_run(
        tmp_path,
        VALIDATED_TOY_AGENT,
        steps=4,
        eval_every=1,
        checkpoint_every=100,
        learning_rate=3e-2,
        eval_tasks="tasks.jsonl",
        validation_tasks="validation.jsonl",
        keep_best=True,
        eval_group_size=2,
        final_eval_group_size=4,
    )
    result = _train(config)
    run = tmp_path / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rollouts = [r["eval_rollouts"] for r in records if r["phase"] == "eval"]
    assert rollouts[-1] == 2 * rollouts[0] and set(rollouts[:-1]) == {rollouts[0]}, "more rollouts after the last step"
    validation = {r["step"]: r["validation_reward"] for r in records if r["phase"] == "validation"}
    held_out = {r["step"]: r["eval_reward"] for r in records if r["phase"] == "eval"}
    assert sorted(validation) == sorted(held_out) == [0, 1, 2, 3, 4]
    assert validation == {0: 0.0, 1: 1.0, 2: 0.0, 3: 0.0, 4: 0.0}
    kept = json.loads((run / "best_adapter" / "best.json").read_text())
    assert kept == {"step": 1, "validation_reward": 1.0, "held_out_reward": held_out[1]}
    assert "the run ends with the adapter of step 1" in result.stderr
    final = load_file(str(run / "final_adapter" / "adapter_model.safetensors"))
    chosen = load_file(str(run / "best_adapter" / "adapter_model.safetensors"))
    last = load_file(str(run / "checkpoints" / "step_000004" / "adapter_model.safetensors"))
    assert final.keys() == chosen.keys() and all(torch.equal(final[k], chosen[k]) for k in final)
    assert not all(torch.equal(final[k], last[k]) for k in final), "the run trained on after step 1"


def test_bad_config_is_one_clear_line(tmp_path: Path) -> None:
    config = _write_run(tmp_path, stepz=3)
    result = subprocess.run(
        [sys.executable, "-m", "agl_bridge.cli", "train", "--config", str(config)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "unknown key 'stepz'" in result.stderr and "Traceback" not in result.stderr


def test_resume_with_another_model_is_refused_clearly(tmp_path: Path) -> None:
    config = _write_run(tmp_path, steps=1, checkpoint_every=1, eval_every=100, batch_size=2, group_size=2)
    _train(config)
    config.write_text(json.dumps({**json.loads(config.read_text()), "steps": 2, "lora_rank": 8}))
    result = subprocess.run(
        [sys.executable, "-m", "agl_bridge.cli", "train", "--config", str(config), "--resume"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "does not match" in result.stderr and "Traceback" not in result.stderr


def test_offline_training_from_a_store_and_from_an_export(tmp_path: Path) -> None:
    online = _write_run(
        tmp_path, steps=2, eval_every=100, checkpoint_every=100, batch_size=3, group_size=3, max_staleness=1
    )
    _train(online)
    store = tmp_path / "run" / "store.sqlite"
    with sqlite3.connect(store) as db:
        step_two_started = db.execute("SELECT MIN(created_at) FROM rollouts WHERE group_id LIKE 's1-%'").fetchone()[0]
        step_one_ended = db.execute(
            "SELECT MAX(a.ended_at) FROM attempts a JOIN rollouts r USING (rollout_id) WHERE r.group_id LIKE 's0-%'"
        ).fetchone()[0]
    assert step_two_started < step_one_ended, "with max_staleness=1, step 2 is sampled while step 1 is still running"
    exported = tmp_path / "trajectories.jsonl"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "agl_bridge.cli",
            "export",
            "--store",
            str(store),
            "--what",
            "trajectories",
            "--out",
            str(exported),
        ],
        check=True,
        capture_output=True,
    )
    for name, source in (("from_store", store), ("from_export", exported)):
        config = tmp_path / f"{name}.json"
        config.write_text(
            json.dumps(
                {
                    "offline_data": str(source),
                    "run_dir": str(tmp_path / name),
                    "steps": 2,
                    "batch_size": 2,
                    "tensorboard": False,
                    "learning_rate": 1e-3,
                }
            )
        )
        _train(config)
        records = _train_records(tmp_path / name)
        assert [r["step"] for r in records] == [1, 2] and all(r["offline"] for r in records)
        assert all(r["trajectories"] == 6 for r in records), "two groups of three rollouts per step"
        assert (tmp_path / name / "final_adapter" / "adapter_config.json").is_file()
        assert (tmp_path / name / "reward_curve.png").is_file(), "offline runs are plotted like every mode"
        assert all(STEP_RECORD_KEYS.union(TRAIN_KEYS) <= r.keys() for r in records), "every mode writes the same record"
        assert all(r["policy_version"] is None and r["rollouts"] is None for r in records), "nothing sampled"
