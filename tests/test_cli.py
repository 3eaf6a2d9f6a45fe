"""The agl-bridge command line: the tiny-model command and its handling of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agl_bridge.cli import app
from agl_bridge.models.tiny import MARKER_FILENAME

runner = CliRunner()


def test_tiny_model_builds_and_reports_where_and_how_big(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    args = ["tiny-model", str(out), "--hidden", "32", "--layers", "1", "--vocab", "600", "--seed", "5"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert str(out.resolve()) in result.output
    assert "vocab 600" in result.output and "parameters" in result.output and "MB on disk" in result.output
    marker = json.loads((out / MARKER_FILENAME).read_text())
    assert marker["args"]["hidden"] == 32 and marker["args"]["seed"] == 5
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 1


@pytest.mark.parametrize(
    ("args", "option", "reason"),
    [
        (["--layers", "0"], "--layers", "layers must be an integer >= 1"),
        (["--hidden", "30"], "--hidden", "multiple of 8"),
        (["--vocab", "100000"], "--vocab", "only supports"),
    ],
)
def test_bad_arguments_are_a_clear_usage_error(tmp_path: Path, args: list[str], option: str, reason: str) -> None:
    out = tmp_path / "tiny"
    result = runner.invoke(app, ["tiny-model", str(out), *args])
    assert result.exit_code == 2
    flat = " ".join(result.output.replace("│", " ").split())
    assert option in flat and reason in flat
    assert "Traceback" not in result.output
    assert not out.exists()


def test_refuses_a_non_empty_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    result = runner.invoke(app, ["tiny-model", str(tmp_path)])
    assert result.exit_code == 2
    assert "not empty" in result.output and "Traceback" not in result.output
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_no_arguments_shows_help() -> None:
    result = runner.invoke(app, [])
    assert "tiny-model" in result.output


def test_demo_samples_and_shows_exact_turn_extension() -> None:
    result = runner.invoke(app, ["demo", "--conversations", "3", "--max-tokens", "6"])
    assert result.exit_code == 0, result.output
    assert result.output.count("exactly") == 3
    assert "tok/s" in result.output


def test_demo_with_a_missing_model_says_what_to_do(tmp_path) -> None:
    result = runner.invoke(app, ["demo", "--model", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "config.json" in result.output
