"""Loading task sets: a JSONL or CSV file, or any Python iterable, as a list of task payloads."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class TaskFileError(ValueError):
    """A task file cannot be read; the message names the file and the line."""


def load_tasks(source: str | Path | Iterable[Any]) -> list[Any]:
    """Tasks from a `.jsonl` file (one JSON value a line), a `.csv` file (one dict a row), or an iterable."""
    if not isinstance(source, (str, Path)):
        return list(source)
    path = Path(source)
    if not path.is_file():
        raise TaskFileError(f"no task file at {path}; give a .jsonl or .csv file")
    if path.suffix.lower() == ".csv":
        return _load_csv(path)
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        return _load_jsonl(path)
    raise TaskFileError(f"{path}: unknown task file type {path.suffix!r}; use .jsonl (one JSON value a line) or .csv")


def _load_jsonl(path: Path) -> list[Any]:
    tasks = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                tasks.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise TaskFileError(
                    f"{path}, line {number}: not valid JSON ({error.msg} at column {error.colno})"
                ) from None
    return tasks


def _load_csv(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames:
            raise TaskFileError(f"{path}: the CSV file has no header row naming the task fields")
        tasks = []
        for row in reader:
            if None in row or any(value is None for value in row.values()):
                raise TaskFileError(
                    f"{path}, line {reader.line_num}: expected {len(reader.fieldnames)} fields like the header"
                )
            tasks.append(dict(row))
    return tasks
