"""A short run of the shop agent's learning script (`learn.py --quick`): the warm start on the careless teacher's
episodes, GRPO through the proxy on the LangGraph agent, and what it trains on — not whether it learns.

Runs in a subprocess (LiteLLM's proxy is one per process) and reads the run's store back.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import langgraph_tool_agent_helpers  # noqa: F401  (puts the example on the import path)
import pytest
from langgraph_tool_agent_helpers import EXAMPLE, prompt_and_response
from shop.agent import MAX_TURNS
from shop.outcome import REASONS
from shop.teacher import teacher_episode

from agl_bridge.chat import ChatCodec
from agl_bridge.train.warm_start import sft_datum

pytestmark = pytest.mark.slow

LEARN = EXAMPLE / "learn.py"


async def read_store(path: Path) -> tuple[list[Any], dict[str, list[Any]], dict[str, list[Any]], dict[str, Any]]:
    """The store's trajectories (converted as training converts them), and per rollout its calls, spans, task."""
    from agl_bridge.convert import convert_store
    from agl_bridge.store.sqlite import SQLiteStore

    async with SQLiteStore(path) as store:
        trajectories = [t async for t in convert_store(store)]
        rollouts = await store.list_rollouts()
        calls = {r.rollout_id: [c async for c in store.iter_llm_calls(r.rollout_id)] for r in rollouts}
        spans = {r.rollout_id: [s async for s in store.iter_spans(r.rollout_id)] for r in rollouts}
    return trajectories, calls, spans, {r.rollout_id: r.task for r in rollouts}


def test_a_quick_learning_run_trains_exactly_the_agents_sampled_tokens(tmp_path: Path, tiny_tokenizer: Any) -> None:
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, str(LEARN), "--quick", "--run-dir", str(run_dir), "--concurrency", "8"],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "COLUMNS": "200"},
        cwd=tmp_path,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    for row in ("before the warm start", "after the warm start (start of RL)", "after RL step 2", "wall time"):
        assert row in result.stdout, result.stdout[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    warm = [r for r in records if r["phase"] == "warm_start"]
    assert warm and all(r["loss"] > 0 for r in warm), "the warm start trained on the teacher's episodes"
    assert [r["step"] for r in records if r["phase"] == "train"] == [1, 2]
    evaluations = [(r["stage"], r["step"], r["eval_rollouts"]) for r in records if r["phase"] == "eval"]
    assert evaluations == [("before_warm_start", 0, 4), ("rl", 0, 4), ("rl", 1, 4), ("rl", 2, 4)]
    held_out = json.loads((run_dir / "held_out.json").read_text())
    assert [e["label"] for e in held_out["evaluations"]] == [
        "before the warm start",
        "after the warm start (start of RL)",
        "after RL step 1",
        "after RL step 2",
    ]
    for evaluation in held_out["evaluations"]:
        assert evaluation["episodes"] == 4 and 0 <= evaluation["success_rate"] <= 1
        assert 0 <= evaluation["well_formed_rate"] <= 1 and 1 <= evaluation["turns_mean"] <= MAX_TURNS
        assert sum(evaluation["reasons"].values()) == 4 and set(evaluation["reasons"]) <= set(REASONS)

    trajectories, calls, spans, tasks = asyncio.run(read_store(run_dir / "store.sqlite"))
    assert trajectories, "every finished episode is a trajectory"
    for rollout_spans in spans.values():
        (episode,) = [s for s in rollout_spans if s.name == "shop.episode"]
        assert episode.attributes["shop.reason"] in REASONS, "every episode's outcome is recorded with its reason"
    merged = 0
    for trajectory in trajectories:
        recorded = [c for c in calls[trajectory.rollout_id] if c.kind == "token"]
        assert 1 <= len(recorded) - len(trajectory.excluded_calls) <= MAX_TURNS
        assert trajectory.reward in (0.0, 1.0)
        # Each call trains exactly its sampled ids where its segment places it; everything else — the system
        # prompt, the tools, the user's question, the tool results between turns — is masked out.
        by_sequence = {call.sequence: call for call in recorded}
        placed = []
        for segment in trajectory.segments:
            trained_at = set()
            for where in segment.calls:
                response = by_sequence[where.sequence].response_token_ids
                assert segment.input_ids[where.response_start : where.response_end] == response
                trained_at.update(range(where.response_start, where.response_end))
                placed.append(where.sequence)
            assert {i for i, mask in enumerate(segment.loss_mask) if mask} == trained_at
            for before, after in zip(segment.calls, segment.calls[1:], strict=False):
                observation = tiny_tokenizer.decode(segment.input_ids[before.response_end : after.response_start])
                assert "<tool_response>" in observation, "between two turns: the tool's result, not trained"
                merged += 1
        assert sorted(placed + [c.sequence for c in trajectory.excluded_calls]) == sorted(by_sequence)
    assert merged, "an episode's turns merge into one training sequence (tool results masked between them)"
    # Each episode's first prompt is the warm start's prompt for that task's first turn.
    codec = ChatCodec(tiny_tokenizer)
    for rollout_id, task in tasks.items():
        first_pair = teacher_episode(task, random.Random(0), 0.0, codec)[0][0]
        prompt_ids, _ = prompt_and_response(sft_datum(codec, *first_pair))
        assert calls[rollout_id][0].prompt_token_ids == prompt_ids, "warm start and RL: the same prompt"
