"""Task loading: JSONL, CSV, iterables, and broken files named by file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from agl_bridge.runner import TaskFileError, load_tasks


def test_jsonl_csv_and_iterables(tmp_path: Path) -> None:
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text('{"n": 1}\n\n{"n": 2}\n"plain"\n')
    assert load_tasks(jsonl) == [{"n": 1}, {"n": 2}, "plain"]
    csv_file = tmp_path / "tasks.csv"
    csv_file.write_text("secret,category\ncat,animals\npiano,instruments\n")
    assert load_tasks(str(csv_file)) == [
        {"secret": "cat", "category": "animals"},
        {"secret": "piano", "category": "instruments"},
    ]
    assert load_tasks(range(3)) == [0, 1, 2]


def test_broken_lines_are_named(tmp_path: Path) -> None:
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text('{"n": 1}\n{"n": \n')
    with pytest.raises(TaskFileError, match=r"tasks.jsonl, line 2: not valid JSON"):
        load_tasks(jsonl)
    csv_file = tmp_path / "tasks.csv"
    csv_file.write_text("a,b\n1,2\n3\n")
    with pytest.raises(TaskFileError, match=r"tasks.csv, line 3: expected 2 fields"):
        load_tasks(csv_file)
    with pytest.raises(TaskFileError, match="no task file"):
        load_tasks(tmp_path / "missing.jsonl")
    with pytest.raises(TaskFileError, match="unknown task file type"):
        load_tasks(_touch(tmp_path / "x.txt"))


def _touch(path: Path) -> Path:
    path.write_text("")
    return path
