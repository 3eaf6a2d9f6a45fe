"""`agl-bridge export` and `agl-bridge inspect`: output, JSON mode, and one-line errors for bad input."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agl_bridge.cli import app
from agl_bridge.convert.graph import label_calls
from agl_bridge.store import SQLiteStore
from agl_bridge.store.export import record_from_json
from agl_bridge.store.inspect import rollout_detail, store_overview
from agl_bridge.store.schema import VERSION_TABLE
from agl_bridge.types import AttemptStatus, LLMCall, Reward, RolloutStatus

runner = CliRunner()
WIDE = {"COLUMNS": "200"}  # rich tables fold long ids in the default 80 columns


def a_call(rollout_id: str | None, attempt_id: str | None, text: str) -> LLMCall:
    return LLMCall(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        model="tiny",
        prompt_token_ids=[1, 2, 3],
        response_token_ids=[4, 5],
        response_logprobs=[-0.1, -2.5e-7],
        token_policy_versions=[2, 3],
        response_text=text,
        finish_reason="stop",
    )


async def _build(path: Path) -> None:
    async with SQLiteStore(path) as store:
        await store.create_rollout({"q": "2+2"}, group_id="g-1", rollout_id="ro-1")
        await store.create_rollout({"q": "3+3"}, rollout_id="ro-2")
        attempt = await store.start_attempt("ro-1")
        await store.add_llm_call(a_call("ro-1", attempt.attempt_id, "four"))
        await store.add_reward(Reward(rollout_id="ro-1", attempt_id=attempt.attempt_id, value=0.75, name="correct"))
        await store.add_llm_call(a_call("ro-1", attempt.attempt_id, "done"))
        await store.finish_attempt(attempt.attempt_id, AttemptStatus.SUCCEEDED)
        await store.set_rollout_status("ro-1", RolloutStatus.SUCCEEDED)
        await store.add_llm_call(a_call(None, None, "outside"))
        await store.add_reward(Reward(value=-1.0, name="offline"))


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    """A store with two rollouts (ro-1 has 2 calls and a reward) and a call and reward outside rollouts."""
    path = tmp_path / "store.db"
    asyncio.run(_build(path))
    return path


def error_line(result) -> str:
    """The one error line a store command prints on stderr; fails if there is more or a traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    return lines[0]


# --- export -------------------------------------------------------------------------------------------


def test_export_writes_every_call_and_reward_and_says_how_many(store_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "calls.jsonl"
    result = runner.invoke(app, ["export", "--store", str(store_path), "--what", "calls", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"Wrote 3 LLM calls and 2 rewards to {out.resolve()}" in result.stdout
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["kind"], r["rollout_id"]) for r in records] == [
        ("llm_call", None), ("reward", None), ("llm_call", "ro-1"), ("reward", "ro-1"), ("llm_call", "ro-1"),
    ]  # fmt: skip
    assert records[2]["response_logprobs"] == [-0.1, -2.5e-7] and records[3]["value"] == 0.75
    assert all(isinstance(record_from_json(r), (LLMCall, Reward)) for r in records)


def test_export_what_defaults_to_calls_and_filters_by_rollout(store_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "ro-1.jsonl"
    result = runner.invoke(app, ["export", "--store", str(store_path), "--out", str(out), "--rollout", "ro-1"])
    assert result.exit_code == 0, result.output
    assert "Wrote 2 LLM calls and 1 rewards of rollout ro-1" in result.stdout
    assert {json.loads(line)["rollout_id"] for line in out.read_text().splitlines()} == {"ro-1"}


def test_export_what_only_accepts_known_choices(store_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    result = runner.invoke(app, ["export", "--store", str(store_path), "--what", "spans", "--out", str(out)])
    assert result.exit_code == 2
    flat = " ".join(result.output.replace("│", " ").split())
    assert "--what" in flat and "'calls'" in flat and "'trajectories'" in flat and "Traceback" not in flat
    assert not out.exists()


def test_export_help_states_the_order_and_choices() -> None:
    result = runner.invoke(app, ["export", "--help"], env=WIDE)
    assert result.exit_code == 0
    flat = " ".join(result.output.replace("│", " ").split())
    assert "records made outside any rollout first, then by rollout id, attempt id and sequence" in flat
    assert "calls" in flat and "--rollout" in flat and "--out" in flat


# --- inspect ------------------------------------------------------------------------------------------


def test_inspect_lists_rollouts_and_records_outside_rollouts(store_path: Path) -> None:
    result = runner.invoke(app, ["inspect", "--store", str(store_path)], env=WIDE)
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if line.startswith("ro-1"))
    assert row.split() == ["ro-1", "succeeded", "runner", "g-1", "1", "2", "1", "0.75", *row.split()[8:]]
    assert any(line.split()[:4] == ["ro-2", "queued", "runner", "–"] for line in result.stdout.splitlines())
    assert "2 rollouts shown; 1 call and 1 reward without a rollout" in result.stdout


def test_inspect_json_is_the_library_overview(store_path: Path) -> None:
    result = runner.invoke(app, ["inspect", "--store", str(store_path), "--json"])
    assert result.exit_code == 0, result.output

    async def expected() -> dict:
        async with SQLiteStore(store_path) as store:
            return (await store_overview(store, limit=100, name=str(store_path))).to_json()

    assert json.loads(result.stdout) == asyncio.run(expected())


def test_inspect_limit_zero_means_all_and_n_cuts(store_path: Path) -> None:
    args = ["inspect", "--store", str(store_path), "--json", "--limit"]
    everything = json.loads(runner.invoke(app, [*args, "0"]).stdout)
    one = json.loads(runner.invoke(app, [*args, "1"]).stdout)
    assert [r["rollout_id"] for r in everything["rollouts"]] == ["ro-1", "ro-2"] and not everything["more_rollouts"]
    assert [r["rollout_id"] for r in one["rollouts"]] == ["ro-1"] and one["more_rollouts"]


def test_inspect_rollout_shows_calls_and_rewards_in_sequence(store_path: Path) -> None:
    result = runner.invoke(app, ["inspect", "--store", str(store_path), "--rollout", "ro-1"], env=WIDE)
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.stdout.splitlines() if line.split()[1:2] in (["call"], ["reward"])]
    assert rows == [
        ["0", "call", "retry", "tiny", "3", "2", "stop", "2", "0", "four"],
        ["1", "reward", "–", "correct", "–", "–", "–", "–", "–", "0.75"],
        ["2", "call", "main", "tiny", "3", "2", "stop", "2", "0", "done"],
    ]
    assert "succeeded" in result.stdout
    assert "2 calls, 1 reward, reward sum 0.75; classes: retry 1, main 1" in result.stdout


def test_inspect_rollout_json_is_the_library_detail(store_path: Path) -> None:
    result = runner.invoke(app, ["inspect", "--store", str(store_path), "--rollout", "ro-1", "--json"])
    assert result.exit_code == 0, result.output

    async def expected() -> dict:
        async with SQLiteStore(store_path) as store:
            return (await rollout_detail(store, "ro-1", limit=100, classify=label_calls)).to_json()

    document = json.loads(result.stdout)
    assert document == asyncio.run(expected())
    records = document["attempts"][0]["records"]
    assert [r["kind"] for r in records] == ["llm_call", "reward", "llm_call"]
    assert [(r.get("call_class"), r.get("parent_sequence")) for r in records] == [
        ("retry", None),
        (None, None),
        ("main", None),
    ]
    assert records[0]["class_reason"].startswith("retry: nothing continued its answer")


# --- bad input ----------------------------------------------------------------------------------------


def _invoke(command: str, store: Path, out: Path, *extra: str):
    args = ["export", "--store", str(store), "--out", str(out)] if command == "export" else [
        "inspect", "--store", str(store),
    ]  # fmt: skip
    return runner.invoke(app, [*args, *extra])


@pytest.mark.parametrize("command", ["export", "inspect"])
def test_missing_store_is_one_line_and_creates_nothing(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "nope.db"
    line = error_line(_invoke(command, missing, tmp_path / "o.jsonl"))
    assert line.startswith(f"Error: no store at {missing}; ")
    assert sorted(tmp_path.iterdir()) == []  # no empty database, no -wal, no export


@pytest.mark.parametrize("command", ["export", "inspect"])
def test_foreign_database_is_refused_with_the_schema_error(tmp_path: Path, command: str) -> None:
    foreign = tmp_path / "other.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER)")
    line = error_line(_invoke(command, foreign, tmp_path / "o.jsonl"))
    assert "not an agl_bridge store" in line and str(foreign) in line
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize("command", ["export", "inspect"])
def test_other_schema_version_is_refused(store_path: Path, tmp_path: Path, command: str) -> None:
    with sqlite3.connect(store_path) as conn:
        conn.execute(f"UPDATE {VERSION_TABLE} SET version = 99")
    line = error_line(_invoke(command, store_path, tmp_path / "o.jsonl"))
    assert "schema version 99" in line and "upgrade agl_bridge" in line


@pytest.mark.parametrize("command", ["export", "inspect"])
def test_unknown_rollout_is_one_line(store_path: Path, tmp_path: Path, command: str) -> None:
    line = error_line(_invoke(command, store_path, tmp_path / "o.jsonl", "--rollout", "ro-zz"))
    hint = f"list its rollouts with `agl-bridge inspect --store {store_path}`"
    assert line == f"Error: no rollout 'ro-zz' in {store_path}; {hint}"
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize(
    ("where", "expected"),
    [("missing/calls.jsonl", "does not exist; create the directory first"), ("adir", "is a directory")],
)
def test_unusable_output_path_is_one_line(store_path: Path, tmp_path: Path, where: str, expected: str) -> None:
    (tmp_path / "adir").mkdir()
    line = error_line(_invoke("export", store_path, tmp_path / where))
    assert expected in line and str(tmp_path / where) in line


def test_read_only_output_location_is_one_line(
    store_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def refuse(path, flags, mode=0o777, *args, **kwargs):  # a read-only directory, as root cannot make one
        if str(path).endswith(".tmp"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, mode, *args, **kwargs)

    monkeypatch.setattr("agl_bridge.export_files.os.open", refuse)
    line = error_line(_invoke("export", store_path, tmp_path / "calls.jsonl"))
    assert f"cannot write {tmp_path / 'calls.jsonl'}: Permission denied" in line
    assert not (tmp_path / "calls.jsonl").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories anyway")
def test_really_read_only_directory_is_one_line(store_path: Path, tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert "Permission denied" in error_line(_invoke("export", store_path, locked / "calls.jsonl"))
    finally:
        locked.chmod(0o700)


def test_export_onto_the_store_itself_is_refused(store_path: Path) -> None:
    before = store_path.read_bytes()
    line = error_line(_invoke("export", store_path, store_path))
    assert "is the store itself" in line
    assert store_path.read_bytes() == before
