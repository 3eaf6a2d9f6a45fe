"""A GRPO run's rank count moves it from one process to several with the same numbers: offline GRPO
on the tiny model with `trainer_ranks = 2` (workers started by the run, Ray tasks, ranks started by
torchrun, FSDP2 shards; and training full weights, sharded) logs the 1-rank run's step metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from algo_helpers import random_trajectories

from agl_bridge.convert import write_trajectories
from agl_bridge.testing.proxy_process import child_env
from agl_bridge.train.run_log import read_metrics

pytest.importorskip("ray", reason="the Ray launch of the ranks needs Ray: pip install 'agl-bridge[ray]'")
pytestmark = pytest.mark.slow

COMPARED = ("loss", "grad_norm", "ratio_mean", "logprob_diff_abs_max", "entropy_mean")


def _config(tmp_path: Path, tiny_model_dir: Path, name: str, **keys: object) -> Path:
    data = tmp_path / "trajectories.jsonl"
    if not data.exists():
        write_trajectories(random_trajectories(7, groups=4, sizes=(3, 4, 2, 3)), data)
    path = tmp_path / f"{name}.json"
    settings = {
        "offline_data": str(data),
        "model": str(tiny_model_dir),
        "run_dir": str(tmp_path / name),
        "steps": 2,
        "batch_size": 2,
        "learning_rate": 1e-3,
        "tensorboard": False,
        **keys,
    }
    path.write_text(json.dumps(settings))
    return path


def _train(command: list[str], config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*command, "train", "--config", str(config)], capture_output=True, text=True, env=child_env(), timeout=600
    )


def _steps(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir) if r["phase"] == "train"]


CLI = [sys.executable, "-m", "agl_bridge.cli"]
TORCHRUN = [
    sys.executable,
    "-m",
    "torch.distributed.run",
    "--standalone",
    "--nproc-per-node",
    "2",
    "-m",
    "agl_bridge.cli",
]


def test_two_ranks_log_the_one_rank_runs_metrics(tmp_path: Path, tiny_model_dir: Path) -> None:
    runs = {
        "one": (CLI, {}),
        "spawned": (CLI, {"trainer_ranks": 2}),
        "torchrun": (TORCHRUN, {"trainer_ranks": 2}),
        "ray": (CLI, {"trainer_ranks": 2, "trainer_launch": "ray"}),
        "fsdp": (TORCHRUN, {"trainer_ranks": 2, "trainer_sharding": "fsdp"}),
        "full": (CLI, {"train_full_weights": True}),
        "full_fsdp": (TORCHRUN, {"trainer_ranks": 2, "trainer_sharding": "fsdp", "train_full_weights": True}),
    }
    steps = {}
    for name, (command, keys) in runs.items():
        result = _train(command, _config(tmp_path, tiny_model_dir, name, **keys))
        assert result.returncode == 0, f"{name}: {result.stderr[-3000:]}"
        steps[name] = _steps(tmp_path / name)
    expected = steps["one"]
    assert [r["step"] for r in expected] == [1, 2] and all(r["datums"] for r in expected)
    for name, baseline in (
        ("spawned", "one"),
        ("torchrun", "one"),
        ("ray", "one"),
        ("fsdp", "one"),
        ("full_fsdp", "full"),
    ):
        expected = steps[baseline]
        assert [r["datums"] for r in steps[name]] == [r["datums"] for r in expected], name
        for got, want in zip(steps[name], expected, strict=True):
            for key in COMPARED:
                assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), (name, got["step"], key)
    # Written once, by rank 0: the same files as the one-process run (full weights: a model directory).
    assert (tmp_path / "spawned" / "final_adapter" / "adapter_config.json").is_file()
    assert (tmp_path / "full_fsdp" / "final_adapter" / "config.json").is_file()


def test_a_launcher_that_started_another_rank_count_is_named(tmp_path: Path, tiny_model_dir: Path) -> None:
    result = _train(TORCHRUN, _config(tmp_path, tiny_model_dir, "mismatch", trainer_ranks=3))
    assert result.returncode != 0
    assert "the launcher started 2 ranks but trainer_ranks is 3" in result.stderr
