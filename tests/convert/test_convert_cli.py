"""`agl-bridge export --what trajectories`: JSON Lines and Parquet files, options, one-line errors."""

from __future__ import annotations

import asyncio
import gc
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agl_bridge.cli import app
from agl_bridge.convert import read_trajectories
from agl_bridge.store import SQLiteStore
from agl_bridge.types import AttemptStatus, LLMCall, Reward, RolloutStatus

runner = CliRunner()


def a_call(rollout_id: str, attempt_id: str, prompt: list[int], response: list[int], agent: str) -> LLMCall:
    return LLMCall(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        model="tiny",
        agent_name=agent,
        prompt_token_ids=prompt,
        response_token_ids=response,
        response_logprobs=[-0.5] * len(response),
        token_policy_versions=[4] * len(response),
    )


async def _build(path: Path) -> None:
    async with SQLiteStore(path) as store:
        for rollout_id, rewarded, outcome in [
            ("ro-1", True, AttemptStatus.SUCCEEDED),
            ("ro-2", False, AttemptStatus.SUCCEEDED),
            ("ro-3", True, AttemptStatus.FAILED),
        ]:
            await store.create_rollout({"task": rollout_id}, group_id="g-1", rollout_id=rollout_id)
            attempt = await store.start_attempt(rollout_id)
            await store.add_llm_call(a_call(rollout_id, attempt.attempt_id, [1, 2], [3], "solver"))
            await store.add_llm_call(a_call(rollout_id, attempt.attempt_id, [50], [51], "critic"))
            await store.add_llm_call(a_call(rollout_id, attempt.attempt_id, [1, 2, 3, 4], [5], "solver"))
            if rewarded:
                await store.add_reward(Reward(rollout_id=rollout_id, attempt_id=attempt.attempt_id, value=1.0))
                await store.add_reward(
                    Reward(rollout_id=rollout_id, attempt_id=attempt.attempt_id, value=1.0, name="fmt")
                )
            await store.finish_attempt(attempt.attempt_id, outcome)
            await store.set_rollout_status(rollout_id, RolloutStatus(outcome.value))


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    """ro-1 rewarded, ro-2 without a reward, ro-3 failed; each with a solver and a critic conversation."""
    path = tmp_path / "store.db"
    asyncio.run(_build(path))
    return path


def export(store: Path, out: Path, *extra: str):
    return runner.invoke(app, ["export", "--store", str(store), "--what", "trajectories", "--out", str(out), *extra])


@pytest.mark.parametrize("file_format", ["jsonl", "parquet"])
def test_export_trajectories_writes_a_file_read_trajectories_loads(
    store_path: Path, tmp_path: Path, file_format: str
) -> None:
    out = tmp_path / f"t.{file_format}"
    result = export(store_path, out, "--format", file_format)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == (
        f"Wrote 1 trajectories (1 segments from 2 LLM calls) to {out.resolve()}; "
        "attempts dropped: failed 1, missing_reward 1; not trained, by class: side 1"
    )
    assert "calls by class: main 2 calls / 2 trained tokens, side 1 calls / 0 trained tokens; 100%" in result.stderr
    (trajectory,) = read_trajectories(out)
    assert trajectory.rollout_id == "ro-1" and trajectory.reward == 2.0 and trajectory.task == {"task": "ro-1"}
    assert [s.input_ids for s in trajectory.segments] == [[1, 2, 3, 4, 5]]
    assert [(call.sequence, call.call_class) for call in trajectory.excluded_calls] == [(1, "side")]
    assert (out.read_bytes()[:4] == b"PAR1") == (file_format == "parquet")


def test_train_classes_choose_what_trains_and_a_wrong_class_is_named(store_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    result = export(store_path, out, "--train-classes", "main,side")
    assert result.exit_code == 0, result.output
    assert "(2 segments from 3 LLM calls)" in result.stdout and "splits: not_extending 1" in result.stdout
    (trajectory,) = read_trajectories(out)
    assert [s.input_ids for s in trajectory.segments] == [[1, 2, 3, 4, 5], [50, 51]]
    assert [s.call_class for s in trajectory.segments] == ["main", "side"]
    wrong = export(store_path, out, "--train-classes", "main,titles")
    assert wrong.exit_code == 2
    assert "--train-classes has 'titles', which is not a call class" in wrong.output


def test_options_select_agents_weigh_rewards_and_keep_unrewarded_attempts(store_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    result = export(
        store_path,
        out,
        "--agent",
        "solver",
        "--missing-reward",
        "zero",
        "--reward-weight",
        "fmt=0.25",
        "--rollout",
        "ro-2",
    )
    assert result.exit_code == 0, result.output
    assert "Wrote 1 trajectories (1 segments from 2 LLM calls) of rollout ro-2" in result.stdout
    (trajectory,) = read_trajectories(out)
    assert trajectory.missing_reward and trajectory.reward == 0.0
    assert [s.input_ids for s in trajectory.segments] == [[1, 2, 3, 4, 5]]
    result = export(store_path, out, "--agent", "solver", "--reward-weight", "fmt=0.25", "--rollout", "ro-1")
    assert read_trajectories(out)[0].reward == 1.25


@pytest.mark.parametrize("file_format", ["jsonl", "parquet"])
def test_missing_reward_error_stops_with_one_line_and_no_file(
    store_path: Path, tmp_path: Path, file_format: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ignored: list[object] = []  # errors raised in finalizers (a Parquet writer left to the GC)
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)
    out = tmp_path / f"t.{file_format}"
    result = export(store_path, out, "--missing-reward", "error", "--format", file_format)
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: rollout 'ro-2' attempt ") and "emit_reward" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert not out.exists() and list(tmp_path.glob(".*tmp")) == []
    del result  # its exception chain keeps the export's frames (and their writer) alive
    gc.collect()
    assert [str(u.exc_value) for u in ignored] == []  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--missing-reward", "maybe"], "missing_reward must be one of"),
        (["--reward-weight", "fmt"], "--reward-weight 'fmt' is not NAME=WEIGHT"),
        (["--reward-weight", "fmt=inf"], "is not NAME=WEIGHT with a finite number"),
    ],
)
def test_bad_options_are_one_line(store_path: Path, tmp_path: Path, args: list[str], expected: str) -> None:
    result = export(store_path, tmp_path / "t.jsonl", *args)
    assert result.exit_code == 2 and expected in result.stderr and "Traceback" not in result.output


def test_calls_export_refuses_parquet_and_conversion_options(store_path: Path, tmp_path: Path) -> None:
    base = ["export", "--store", str(store_path), "--what", "calls", "--out", str(tmp_path / "c.jsonl")]
    result = runner.invoke(app, [*base, "--format", "parquet"])
    assert result.exit_code == 2 and "JSON Lines only" in result.stderr
    result = runner.invoke(app, [*base, "--agent", "solver"])
    assert result.exit_code == 2 and "apply to --what trajectories only" in result.stderr
    result = runner.invoke(app, base)
    assert result.exit_code == 0 and "Wrote 9 LLM calls and 4 rewards" in result.stdout


def test_unknown_rollout_is_one_line(store_path: Path, tmp_path: Path) -> None:
    result = export(store_path, tmp_path / "t.jsonl", "--rollout", "nope")
    assert result.exit_code == 2 and "no rollout 'nope'" in result.stderr
    assert not (tmp_path / "t.jsonl").exists()


async def _serve_only_store(path: Path) -> None:
    """What `agl-bridge serve` alone leaves: rollouts registered by their first call, finished (or not) over HTTP."""
    async with SQLiteStore(path) as store:
        for rollout_id, outcome in [("h-1", AttemptStatus.SUCCEEDED), ("h-2", AttemptStatus.FAILED), ("h-3", None)]:
            await store.add_llm_call(a_call(rollout_id, "0", [1, 2], [3], "solver"))
            await store.report_reward(Reward(rollout_id=rollout_id, attempt_id="0", value=1.0))
            if outcome is not None:
                await store.complete_attempt(rollout_id, "0", outcome)


def test_a_store_written_by_serve_alone_exports_and_says_what_it_left_out(tmp_path: Path) -> None:
    store = tmp_path / "serve.db"
    asyncio.run(_serve_only_store(store))
    out = tmp_path / "t.jsonl"
    for _ in range(2):  # every time
        result = runner.invoke(app, ["export", "--store", str(store), "--what", "trajectories", "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert "Wrote 1 trajectories" in result.stdout
        assert "not converted: 1 failed attempts (never trained); 1 attempts still running" in result.stderr
        assert "POST .../finish" in result.stderr and "--rollout-idle-timeout" in result.stderr
    assert [t.rollout_id for t in read_trajectories(out)] == ["h-1"]
