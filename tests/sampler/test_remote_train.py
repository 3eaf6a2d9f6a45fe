"""`agl-bridge train` with `sampler = "remote"`: the GRPO loop samples on a second `agl-bridge serve`,
writes each step's adapter to adapter_dir, loads it there as `tiny-v<N>` and records tokens with N."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from remote_helpers import KEY, serving

from agl_bridge.testing.proxy_process import child_env

pytestmark = pytest.mark.slow

AGENT = """
def agent(task, endpoint):
    client = endpoint.openai_client()
    reply = client.chat.completions.create(
        model=endpoint.model, messages=[{"role": "user", "content": f"Write about {task}."}], max_tokens=6,
        extra_body={"return_token_ids": True},
    )
    ids = reply.choices[0].model_extra["token_ids"]
    return len(reply.choices[0].message.content or "") / max(1, len(ids))
"""


@pytest.fixture(scope="module")
def train_target(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    with serving(tiny_model_dir, tmp_path_factory.mktemp("train_target") / "target.sqlite") as server:
        yield server


def test_grpo_with_a_remote_sampler_syncs_every_step_by_version(
    train_target, tiny_model_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in ["cats", "dogs", "rain", "bread"]))
    config = {
        "agent": f"{tmp_path / 'agent.py'}:agent",
        "tasks": "tasks.jsonl",
        "run_dir": str(tmp_path / "run"),
        "model": str(tiny_model_dir),
        "steps": 2,
        "batch_size": 2,
        "group_size": 4,
        "learning_rate": 3e-3,
        "aggregation": "token_mean",
        "default_max_tokens": 6,
        "tensorboard": False,
        "checkpoint_every": 2,
        "sampler": "remote",
        "sampler_urls": [train_target.url],
        "sampler_api_key": KEY,
        "sampler_model": "tiny",
        "adapter_dir": str(tmp_path / "adapters"),
    }
    (tmp_path / "run.json").write_text(json.dumps(config))
    result = subprocess.run(
        [sys.executable, "-m", "agl_bridge.cli", "train", "--config", str(tmp_path / "run.json")],
        capture_output=True,
        text=True,
        timeout=400,
        env={**child_env(), "COLUMNS": "200"},
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("phase") == "train"]
    assert [r["policy_version"] for r in train] == [1, 2]
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == ["tiny-v2"], (
        "older versions are unloaded and removed"
    )
    with sqlite3.connect(tmp_path / "run" / "store.sqlite") as db:
        versions = {row[0] for row in db.execute("SELECT policy_version FROM llm_calls")}
    assert versions <= {0, 1} and 0 in versions, versions
