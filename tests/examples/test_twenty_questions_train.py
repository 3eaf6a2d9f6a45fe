"""One GRPO step (batch 2 × group 2) of the CrewAI agent through the proxy with the tiny model, end to end.

Runs train.py in a subprocess (LiteLLM's proxy is one per process) and checks what the run recorded:
every player call with token ids, the player's turns merged into few training sequences, CrewAI's
own spans in the same rollouts, a reward per game, and a training step.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


async def read_store(path: Path) -> dict[str, tuple[list, list, list]]:
    """(calls, spans, rewards) of every rollout in a run's store."""
    from agl_bridge.store.sqlite import SQLiteStore

    async with SQLiteStore(path) as store:
        out = {}
        for rollout in await store.list_rollouts():
            rid = rollout.rollout_id
            out[rid] = (
                [c async for c in store.iter_llm_calls(rid)],
                [s async for s in store.iter_spans(rid)],
                [r async for r in store.iter_rewards(rid)],
            )
        return out


async def all_scopes(path: Path) -> set[str | None]:
    """The instrumentation scopes of every span in a store, rollout or not."""
    from agl_bridge.store.sqlite import SQLiteStore

    async with SQLiteStore(path) as store:
        return {s.scope_name async for s in store.iter_all_spans()}


TRAIN = ROOT / "examples" / "crewai_twenty_questions" / "train.py"


def test_one_training_step_through_the_proxy(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = {**os.environ, "TWENTYQ_MAX_TURNS": "6", "COLUMNS": "160"}
    result = subprocess.run(
        [
            sys.executable,
            str(TRAIN),
            "--batch-size",
            "2",
            "--group-size",
            "2",
            "--steps",
            "1",
            "--no-eval",
            "--no-tensorboard",
            "--concurrency",
            "4",
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "twenty questions: 1 steps" in result.stdout

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["phase"] == "train"]
    assert [r["step"] for r in train] == [1]
    step = train[0]
    assert step["rollouts"] == 4 and step["rollouts_failed"] == 0 and step["rollouts_timed_out"] == 0
    assert step["trajectories"] == 4 and step["reward_mean"] is not None
    assert (run_dir / "final_adapter" / "adapter_config.json").is_file()
    assert (run_dir / "crewai").is_dir() or not list(run_dir.glob("crewai*"))  # storage kept under the run dir

    records_by_rollout = asyncio.run(read_store(run_dir / "store.sqlite"))
    assert len(records_by_rollout) == 4
    for rollout, (calls, spans, rewards) in records_by_rollout.items():
        assert len(calls) == 6, "one player call per turn (6 turns)"
        assert all(c.kind == "token" and c.prompt_token_ids and c.response_token_ids for c in calls)
        names = Counter(s.name for s in spans)
        ours = [s for s in spans if s.attributes.get("gen_ai.provider.name") == "agl_bridge"]
        assert len(ours) == 6, "the proxy's span of every player call (GenAI conventions: 'chat {model}', client)"
        assert all(s.name == f"chat {s.attributes['gen_ai.request.model']}" and s.kind == "client" for s in ours)
        crewai_spans = [s.name for s in spans if s.scope_name == "crewai"]
        assert crewai_spans, f"no CrewAI spans in rollout {rollout}: {names}"
        assert [r.value for r in rewards] in ([0.0], [1.0])
    # No span of the proxy's own HTTP handling (FastAPI's native tracing) was exported back into the store.
    assert "fastapi" not in asyncio.run(all_scopes(run_dir / "store.sqlite"))
    # The player's turns merge: far fewer training sequences than calls.
    assert step["segments"] < 4 * 6
