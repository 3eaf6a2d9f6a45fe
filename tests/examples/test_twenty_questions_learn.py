"""A short run of the learning script (`learn.py --quick`): the warm start on the scripted games, GRPO
through the proxy on the CrewAI flow, and what it trains on — not whether it learns (the benchmark's job).

Runs in a subprocess (LiteLLM's proxy is one per process) and reads the run's store back.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LEARN = ROOT / "examples" / "crewai_twenty_questions" / "learn.py"


async def trajectories(path: Path) -> list:
    """Every trajectory of a store, converted as training converts them."""
    from agl_bridge.convert import convert_store
    from agl_bridge.store.sqlite import SQLiteStore

    async with SQLiteStore(path) as store:
        return [t async for t in convert_store(store)]


async def player_calls(path: Path) -> dict[str, list]:
    """The recorded LLM calls of every rollout."""
    from agl_bridge.store.sqlite import SQLiteStore

    async with SQLiteStore(path) as store:
        return {
            r.rollout_id: [c async for c in store.iter_llm_calls(r.rollout_id)] for r in await store.list_rollouts()
        }


def test_a_quick_learning_run_trains_exactly_the_players_sampled_tokens(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, str(LEARN), "--quick", "--run-dir", str(run_dir), "--concurrency", "8"],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "COLUMNS": "160"},
        cwd=tmp_path,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    for row in ("before the warm start", "after the warm start (start of RL)", "end of RL"):
        assert row in result.stdout, result.stdout[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    warm = [r for r in records if r["phase"] == "warm_start"]
    assert warm and all(r["loss"] > 0 for r in warm), "the warm start trained on the scripted games"
    assert [r["step"] for r in records if r["phase"] == "train"] == [1, 2]
    evaluations = [(r["stage"], r["step"], r["eval_rollouts"]) for r in records if r["phase"] == "eval"]
    assert evaluations == [("before_warm_start", 0, 4), ("rl", 0, 4), ("rl", 1, 4), ("rl", 2, 4)]

    calls = asyncio.run(player_calls(run_dir / "store.sqlite"))
    by_rollout = {t.rollout_id: t for t in asyncio.run(trajectories(run_dir / "store.sqlite"))}
    assert by_rollout, "every finished game is a trajectory"
    for rollout_id, trajectory in by_rollout.items():
        recorded = [c for c in calls[rollout_id] if c.kind == "token"]
        retries = len(trajectory.excluded_calls)  # CrewAI re-sent a prompt: a discarded branch, not a turn
        assert 1 <= len(recorded) - retries <= 8, "one player call per turn, at most MAX_TURNS"
        # Each call trains exactly its sampled response ids where the segment places it; everything else (the
        # prompt, CrewAI's system prompt, the answerer's replies) is masked out. A reply that broke the prompt
        # prefix (a wasted empty turn, a template that rewrote an earlier reply) starts another segment, so the
        # segments' order need not be the calls' order; every call trains once or is listed as excluded.
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
        excluded = [call.sequence for call in trajectory.excluded_calls]
        assert sorted(placed + excluded) == sorted(by_sequence)
        first = trajectory.segments[0]
        assert first.input_ids[: len(recorded[0].prompt_token_ids)] == recorded[0].prompt_token_ids
        game_turns = len(recorded) - retries
        # learn.py's default reward: 1 less 0.05 a turn after the first for a won game, 0 for a lost one
        assert trajectory.reward == 0.0 or trajectory.reward == pytest.approx(1.0 - 0.05 * (game_turns - 1))
    segments = sum(len(t.segments) for t in by_rollout.values())
    turns = sum(len([c for c in calls[r] if c.kind == "token"]) for r in by_rollout)
    assert segments < turns, "a game's turns merge into one training sequence unless a reply broke the prefix"
