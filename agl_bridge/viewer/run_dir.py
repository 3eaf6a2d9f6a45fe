"""What the viewer reads from a training run directory: the run's settings and its metrics.jsonl curves.

Settings come from the `config.json` the GRPO loop writes at start: the model (for token text) and
the keys that decide how the trainer converted and scored the store (`reward_weights`,
`missing_reward`, `advantage` / `advantage_std_scaling`). Without a run directory the converter's defaults apply.

`MetricsLog` re-reads metrics.jsonl only when it changed (size, mtime or inode), so polling pages
cost nothing between steps; a torn last line (a run killed mid-write) is skipped, and a file
rewritten by a resume (`drop_records_after`) is read afresh.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agl_bridge.convert import DEFAULT_TRAIN_CLASSES, ConvertOptions
from agl_bridge.store.location import is_postgres_location

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
STORE_FILE = "store.sqlite"
"""The store a training run records into, inside its run directory."""


def run_store(run_dir: Path) -> str:
    """The store a run recorded into: its config's PostgreSQL `store` URL, else `run_dir/store.sqlite`."""
    try:
        store = json.loads((run_dir / CONFIG_FILE).read_text(encoding="utf-8")).get("store")
    except (OSError, ValueError, AttributeError):
        store = None
    return store if is_postgres_location(store) else str(run_dir / STORE_FILE)


@dataclass(frozen=True, slots=True)
class RunSettings:
    """How the run's trainer read the store: conversion options, std scaling, and its model."""

    options: ConvertOptions = field(default_factory=ConvertOptions)
    std_scaling: bool = False
    advantage: str = "group_mean"
    model: str | None = None
    source: str = "the converter's defaults (no run directory)"


class RunConfigError(ValueError):
    """A run directory's config.json cannot be used; the message names the file and the key."""


def load_run_settings(run_dir: Path | None) -> RunSettings:
    """The settings recorded in `run_dir/config.json` (defaults when there is none)."""
    if run_dir is None:
        return RunSettings()
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        return RunSettings(source=f"the converter's defaults ({path} does not exist)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RunConfigError(f"cannot read {path}: {exc}; pass the run_dir of a training run") from None
    if not isinstance(config, dict):
        raise RunConfigError(f"{path} is not a JSON object; pass the run_dir of a training run")
    missing_reward = config.get("missing_reward", "drop")
    try:
        options = ConvertOptions(
            reward_weights=config.get("reward_weights") or {},
            # A run with "error" stopped at the first attempt without a reward; pages show such an attempt as dropped.
            missing_reward="drop" if missing_reward == "error" else missing_reward,
            train_classes=config.get("train_call_classes") or DEFAULT_TRAIN_CLASSES,
        )
    except ValueError as exc:
        raise RunConfigError(f"{path}: {exc}") from None
    model = config.get("model")
    return RunSettings(
        options=options,
        std_scaling=bool(config.get("advantage_std_scaling", False)) or config.get("advantage") == "mean_std",
        advantage=str(config.get("advantage") or "group_mean"),
        model=model if isinstance(model, str) and model else None,
        source=str(path),
    )


@dataclass(frozen=True, slots=True)
class Series:
    """One line of a chart: `key` of the records of `phase` (eval: RL-stage evaluations only)."""

    phase: str
    key: str
    label: str


@dataclass(frozen=True, slots=True)
class Chart:
    """One chart of the runs page."""

    chart_id: str
    title: str
    series: tuple[Series, ...]


CHARTS: tuple[Chart, ...] = (
    Chart(
        "reward",
        "Reward",
        (
            Series("train", "reward_mean", "reward (training rollouts)"),
            Series("eval", "eval_reward", "held-out reward"),
            Series("validation", "validation_reward", "validation reward"),
        ),
    ),
    Chart("loss", "Loss", (Series("train", "loss", "loss"),)),
    Chart("entropy", "Entropy (nats per trained token)", (Series("train", "entropy_mean", "entropy"),)),
    Chart(
        "gap",
        "Sampler–trainer logprob gap",
        (
            Series("train", "logprob_diff_abs_mean", "mean |Δ logprob|"),
            Series("train", "logprob_diff_abs_max", "max |Δ logprob|"),
        ),
    ),
    Chart(
        "time",
        "Step time (s)",
        (
            Series("train", "time_step_s", "step"),
            Series("train", "time_sample_s", "sampling"),
            Series("train", "time_train_s", "training"),
        ),
    ),
)
"""The curves of the runs page; keys as every training mode writes them (agl_bridge/train/step_record.py)."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _in_series(record: dict[str, Any], series: Series) -> bool:
    if record.get("phase") != series.phase:
        return False
    # Evaluations before the supervised warm start share step 0 with the one after it; the curve shows RL.
    return series.phase != "eval" or record.get("stage", "rl") == "rl"


class MetricsLog:
    """A run's metrics.jsonl, parsed again only when the file changed."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / METRICS_FILE
        self._stamp: tuple[int, int, int] | None = None
        self._records: list[dict[str, Any]] = []

    def _current_stamp(self) -> tuple[int, int, int] | None:
        try:
            stat = os.stat(self.path)
        except OSError:
            return None
        return (stat.st_ino, stat.st_size, stat.st_mtime_ns)

    def version(self) -> str:
        """Changes whenever the file does (for the live pages)."""
        stamp = self._current_stamp()
        return "none" if stamp is None else "-".join(map(str, stamp))

    def records(self) -> list[dict[str, Any]]:
        """Every complete record, in file order ([] when the file does not exist)."""
        stamp = self._current_stamp()
        if stamp != self._stamp:
            self._records = self._parse() if stamp is not None else []
            self._stamp = stamp
        return self._records

    def _parse(self) -> list[dict[str, Any]]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError:
            return []
        records = []
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a torn last line: the next read sees it whole
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                records.append(record)
        return records

    def train_records(self) -> list[dict[str, Any]]:
        """The training steps' records, by step (a step logged twice after a resume: the last one)."""
        by_step = {r["step"]: r for r in self.records() if r.get("phase") == "train"}
        return [by_step[step] for step in sorted(by_step)]

    def charts(self) -> list[dict[str, Any]]:
        """The CHARTS as JSON for the page's script: each series a list of [step, value or null]."""
        records = self.records()
        charts = []
        for chart in CHARTS:
            series = []
            for line in chart.series:
                points: dict[int, float | None] = {}
                for record in records:
                    if _in_series(record, line) and line.key in record:
                        points[record["step"]] = _number(record[line.key])
                if points:
                    series.append({"label": line.label, "points": [[step, points[step]] for step in sorted(points)]})
            charts.append({"id": chart.chart_id, "title": chart.title, "series": series})
        return charts
