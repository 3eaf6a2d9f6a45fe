"""`inspect`, `export` and offline training on a PostgreSQL store: the same output as on SQLite, one-line errors.

Each comparison writes the same records into a SQLite file and a PostgreSQL database (ids and
clock made replayable, so both hold identical records) and runs the command on each. The bad
inputs (nothing listening, a refused password, a missing database, a database without our
tables, a newer schema) each get one line naming host and port and the fix, never a traceback,
and never the password. Skips, saying why, where no PostgreSQL server can be started.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import psycopg
import pytest
from shared_helpers import free_port, replayable_stores
from typer.testing import CliRunner

from agl_bridge.cli import STORE_ENV, app
from agl_bridge.convert import DEFAULT_OPTIONS
from agl_bridge.store import store_at
from agl_bridge.store.errors import NoStoreError
from agl_bridge.store.postgres_check import StoreConnectionError, check_postgres_store
from agl_bridge.store.schema import VERSION_TABLE
from agl_bridge.train.offline import offline_groups
from agl_bridge.types import AttemptStatus, LLMCall, Reward, RolloutStatus

runner = CliRunner()
WIDE = {"COLUMNS": "200"}


def a_call(rollout_id: str | None, attempt_id: str | None, text: str, response: list[int]) -> LLMCall:
    return LLMCall(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        model="tiny",
        prompt_token_ids=[1, 2, 3],
        response_token_ids=response,
        response_logprobs=[-0.1 * (i + 1) for i in range(len(response))],
        token_policy_versions=[2] * len(response),
        messages=[{"role": "user", "content": "2+2?"}],
        response_text=text,
        finish_reason="stop",
    )


async def build(location: str | Path) -> None:
    """Two rollouts of group g-1 that train (rewards 1 and 0), one still queued, and records outside any rollout."""
    async with store_at(location) as store:
        for rollout_id, value, text in (("ro-1", 1.0, "four\x00!"), ("ro-2", 0.0, "five")):
            await store.create_rollout({"q": "2+2"}, group_id="g-1", rollout_id=rollout_id)
            attempt = (await store.start_attempt(rollout_id)).attempt_id
            await store.add_llm_call(a_call(rollout_id, attempt, text, [4, 5, 6]))
            await store.add_reward(
                Reward(rollout_id=rollout_id, attempt_id=attempt, value=value, name="correct", timestamp=5.0)
            )
            await store.finish_attempt(attempt, AttemptStatus.SUCCEEDED)
            await store.set_rollout_status(rollout_id, RolloutStatus.SUCCEEDED)
        await store.create_rollout({"q": "3+3"}, rollout_id="ro-3")
        await store.add_llm_call(a_call(None, None, "outside", [7]))
        await store.add_reward(Reward(value=-1.0, name="offline", timestamp=6.0))


@pytest.fixture
def stores(tmp_path: Path, postgres_dsn: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """(a SQLite file, a PostgreSQL URL) holding the same records."""
    sqlite = str(tmp_path / "store.db")
    for location in (sqlite, postgres_dsn):
        replayable_stores(monkeypatch)
        asyncio.run(build(location))
    return sqlite, postgres_dsn


def invoke(*args: str, env: dict[str, str] | None = None):
    return runner.invoke(app, list(args), env={**WIDE, **(env or {})})


def one_error_line(result, code: int) -> str:
    """The single `Error:` line a failed command printed; fails on a traceback or more lines."""
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


# --- the same output --------------------------------------------------------------------------------


def test_inspect_shows_a_postgresql_store_as_it_shows_the_same_sqlite_store(stores: tuple[str, str]) -> None:
    sqlite, postgres = stores
    name = f"postgresql://127.0.0.1:{postgres.split(':')[2].split('/')[0]}/postgres as postgres"
    for extra in ([], ["--json"], ["--rollout", "ro-1"], ["--rollout", "ro-1", "--json"]):
        on_sqlite, on_postgres = (invoke("inspect", "--store", where, *extra) for where in (sqlite, postgres))
        assert on_sqlite.exit_code == 0 and on_postgres.exit_code == 0, (on_sqlite.output, on_postgres.output)
        assert on_postgres.stdout.replace(name, sqlite) == on_sqlite.stdout, extra
    overview = json.loads(invoke("inspect", "--store", postgres, "--json").stdout)
    assert [row["rollout_id"] for row in overview["rollouts"]] == ["ro-1", "ro-2", "ro-3"]
    assert (overview["calls_without_rollout"], overview["rewards_without_rollout"]) == (1, 1)


@pytest.mark.parametrize("what", ["calls", "trajectories"])
def test_export_of_a_postgresql_store_is_byte_for_byte_the_sqlite_export(
    stores: tuple[str, str], tmp_path: Path, what: str
) -> None:
    outputs = []
    for index, where in enumerate(stores):
        out = tmp_path / f"{what}-{index}.jsonl"
        result = invoke("export", "--store", where, "--what", what, "--out", str(out))
        assert result.exit_code == 0, result.output
        assert result.stdout.replace(str(out.resolve()), "OUT") == (
            "Wrote 3 LLM calls and 3 rewards to OUT\n"
            if what == "calls"
            else "Wrote 2 trajectories (2 segments from 2 LLM calls) to OUT\n"
        )
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1] and outputs[0]
    if what == "calls":  # the NUL the model sampled came back exactly from PostgreSQL's BYTEA
        assert json.loads(outputs[1].splitlines()[2])["response_text"] == "four\x00!"


def test_agl_store_names_the_store_when_store_is_not_given(stores: tuple[str, str], tmp_path: Path) -> None:
    _, postgres = stores
    listed = invoke("inspect", "--json", env={STORE_ENV: postgres})
    assert listed.exit_code == 0, listed.output
    assert len(json.loads(listed.stdout)["rollouts"]) == 3
    out = tmp_path / "calls.jsonl"
    assert invoke("export", "--out", str(out), env={STORE_ENV: postgres}).exit_code == 0
    assert len(out.read_text().splitlines()) == 6


def test_offline_training_reads_the_same_groups_from_postgresql(stores: tuple[str, str]) -> None:
    sqlite, postgres = stores
    from_sqlite, from_postgres = (asyncio.run(offline_groups(where, DEFAULT_OPTIONS)) for where in (sqlite, postgres))
    assert from_postgres == from_sqlite
    assert [len(group) for group in from_postgres] == [2]


def test_an_unknown_rollout_names_the_database_and_never_the_password(stores: tuple[str, str]) -> None:
    _, postgres = stores
    with_password = postgres.replace("postgres@", "postgres:s3cret@", 1)  # trusted: the password is not checked
    line = one_error_line(invoke("inspect", "--store", with_password, "--rollout", "ro-9"), 2)
    assert "no rollout 'ro-9' in postgresql://127.0.0.1:" in line and "s3cret" not in line


# --- bad input: one line each, naming host and port and the fix ---------------------------------------


@pytest.mark.parametrize("command", ["inspect", "export", "view"])
def test_nothing_listening_is_one_line_naming_host_and_port(command: str, tmp_path: Path) -> None:
    port = free_port()
    dsn = f"postgresql://agl:hunter2@127.0.0.1:{port}/agl"
    args = {"inspect": [], "export": ["--out", str(tmp_path / "x.jsonl")], "view": ["--port", "0"]}[command]
    line = one_error_line(invoke(command, "--store", dsn, *args), 1)
    assert f"127.0.0.1:{port}/agl as agl" in line and "start the PostgreSQL server" in line, line
    assert "hunter2" not in line and "no store at" not in line


def test_a_refused_password_is_one_line_saying_to_check_it(postgres_server) -> None:
    role = f"agl_pw_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_server.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'right-one'")
        hba = Path(conn.execute("SHOW hba_file").fetchone()[0])
        hba.write_text(f"host all {role} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
        conn.execute("SELECT pg_reload_conf()")
    dsn = f"postgresql://{role}:wrong-one@127.0.0.1:{postgres_server.port}/postgres"
    for _ in range(50):  # the reload is asynchronous: wait until the server asks for the password
        try:
            psycopg.connect(dsn, connect_timeout=2).close()
        except psycopg.OperationalError:
            break
    line = one_error_line(invoke("inspect", "--store", dsn), 1)
    assert f"127.0.0.1:{postgres_server.port}/postgres as {role}" in line and "password" in line, line
    assert "check the user and password" in line and "wrong-one" not in line


def test_a_missing_database_is_one_line(postgres_server) -> None:
    line = one_error_line(invoke("inspect", "--store", postgres_server.dsn("no_such_db")), 1)
    assert f"127.0.0.1:{postgres_server.port}/no_such_db" in line and "check the database name" in line, line


@pytest.mark.parametrize("command", ["inspect", "export"])
def test_a_database_without_a_store_is_refused_and_left_empty(postgres_dsn: str, tmp_path: Path, command: str) -> None:
    extra = ["--out", str(tmp_path / "x.jsonl")] if command == "export" else []
    line = one_error_line(invoke(command, "--store", postgres_dsn, *extra), 2)
    assert "holds no agl_bridge store" in line and "check the database" in line, line
    with psycopg.connect(postgres_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()").fetchone() == (0,)
    assert not (tmp_path / "x.jsonl").exists()


def test_a_newer_schema_version_is_one_line_saying_to_upgrade(stores: tuple[str, str]) -> None:
    _, postgres = stores
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute(f"UPDATE {VERSION_TABLE} SET version = version + 7, created_by = 'agl_bridge 99.0'")
    line = one_error_line(invoke("inspect", "--store", postgres), 2)
    assert "has schema version" in line and "upgrade agl_bridge" in line, line


def test_offline_data_on_a_dead_server_fails_before_training(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "offline.json"
    config.write_text(
        json.dumps({"offline_data": f"postgresql://agl@127.0.0.1:{port}/agl", "run_dir": str(tmp_path / "run")})
    )
    line = one_error_line(invoke("train", "--config", str(config)), 2)
    assert line.startswith("Error: offline_data: cannot connect") and f"127.0.0.1:{port}" in line, line


def test_the_check_itself_raises_the_store_errors(postgres_dsn: str) -> None:
    with pytest.raises(NoStoreError, match="holds no agl_bridge store"):
        check_postgres_store(postgres_dsn)
    with pytest.raises(StoreConnectionError, match="nothing listens there"):
        check_postgres_store(f"postgresql://agl@127.0.0.1:{free_port()}/agl")
