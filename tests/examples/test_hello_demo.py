"""The main job, shortened: the hello demo runs end to end and writes well-formed results."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TRAIN_KEYS = {
    "step",
    "policy_version",
    "reward_mean",
    "rollouts",
    "trajectories",
    "datums",
    "loss",
    "grad_norm",
    "lr",
    "logprob_diff_abs_mean",
    "time_sample_s",
    "time_convert_s",
    "time_train_s",
    "time_sync_s",
    "overhead_share",
}


def test_quick_demo_writes_metrics_curve_adapter_and_summary(tmp_path: Path) -> None:
    run_dir = tmp_path / "hello"
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "hello_qwen" / "train.py"), "--quick", "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "160"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "supervised warm start" in result.stderr
    assert "held-out reward" in result.stdout and "start of RL" in result.stdout
    assert "end of RL (3 steps, last adapter)" in result.stdout
    assert not (run_dir / "best_adapter").exists()  # the demo ends with its last adapter: nothing is chosen

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["phase"] == "train"]
    evals = [r for r in records if r["phase"] == "eval"]
    assert [r["step"] for r in train] == [1, 2, 3]
    for record in train:
        assert TRAIN_KEYS <= record.keys(), TRAIN_KEYS - record.keys()
        assert -1.0 <= record["reward_mean"] <= 1.0 and record["rollouts"] == 16
        if record["datums"]:  # a step whose groups all had equal returns trains nothing (loss etc. null)
            assert record["logprob_diff_abs_mean"] < 1e-3
            assert all(math.isfinite(record[k]) for k in ("loss", "grad_norm", "overhead_share"))
    stages = [r.get("stage") for r in evals]
    assert stages[0] == "before_warm_start" and stages.count("rl") == 4  # after the warm start, then every step
    # 40 held-out numbers once each, and twice each after the last step (final_eval_group_size)
    assert [r["eval_rollouts"] for r in evals] == [40] * 4 + [80]
    assert not [r for r in records if r["phase"] == "validation"]
    assert (run_dir / "reward_curve.png").stat().st_size > 10_000
    assert (run_dir / "final_adapter" / "adapter_config.json").is_file()
    assert (run_dir / "checkpoints" / "step_000003").is_dir()
