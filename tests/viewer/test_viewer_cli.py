"""`agl-bridge view`: one-line errors for bad input, and the real server answering over HTTP."""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner
from viewer_helpers import start_viewer

from agl_bridge.cli import app
from agl_bridge.store.schema import VERSION_TABLE

runner = CliRunner()


def error_line(*args: str) -> str:
    """Run `agl-bridge view ARGS`, expect exit 2 and one error line; return it."""
    result = runner.invoke(app, ["view", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


def test_a_path_that_is_not_a_store_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.sqlite"
    assert str(missing) in error_line("--store", str(missing))
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database " * 100)
    assert f"{notes} is not an agl_bridge store" in error_line("--store", str(notes))
    assert "is not a directory" in error_line("--run-dir", str(tmp_path / "no-run"))
    assert "pass --store PATH" in error_line()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{not json")
    assert f"cannot read {tmp_path / 'run' / 'config.json'}" in error_line("--run-dir", str(tmp_path / "run"))


def test_another_schema_version_gets_the_clis_message(scenario_store: Path, tmp_path: Path) -> None:
    copy = tmp_path / "old.sqlite"
    copy.write_bytes(scenario_store.read_bytes())
    with sqlite3.connect(copy) as conn:
        conn.execute(f"UPDATE {VERSION_TABLE} SET version = 99")
    inspect = runner.invoke(app, ["inspect", "--store", str(copy)])
    assert inspect.exit_code == 2
    assert error_line("--store", str(copy)) == inspect.output.strip()


def test_a_public_bind_needs_a_key(scenario_store: Path) -> None:
    assert "without an explicit key" in error_line("--store", str(scenario_store), "--host", "0.0.0.0")


@pytest.mark.slow
def test_the_server_answers_over_http_and_stops_on_ctrl_c(scenario_store: Path, run_dir: Path) -> None:
    process, url = start_viewer("--store", str(scenario_store), "--run-dir", str(run_dir))
    try:
        with httpx.Client(follow_redirects=True, timeout=30) as client:
            page = client.get(url)
            assert page.status_code == 200 and "Steps" in page.text
            assert str(page.url).endswith("/")  # the key left the address
            assert client.get(url.split("/?")[0] + "/rollouts/ro-a2").status_code == 200  # the cookie carries it
            assert httpx.get(url.split("/?")[0] + "/rollouts").status_code == 401
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
