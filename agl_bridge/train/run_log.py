"""Seeing a run: one JSON line of metrics per step, TensorBoard, W&B when asked, a live console,
and the figures a run ends with.

`metrics.jsonl` is the source of truth (one object per step or evaluation, flushed as written, so a
crashed run keeps everything up to its last step); the other sinks mirror it.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console


@dataclass
class RunSummary:
    """The figures a run ends with."""

    run_dir: Path
    steps: int
    wall_time_s: float
    eval_start: float | None
    eval_end: float | None
    warm_start: dict[str, float | None] = field(default_factory=dict)
    kept_step: int | None = None
    """With `keep_best`: the step whose adapter the run ended with (eval_end is its held-out reward)."""
    eval_last: float | None = None
    """The held-out reward of the last step's adapter (eval_end too, unless `keep_best` kept another)."""


class RunLog:
    """Writes metrics records to metrics.jsonl, TensorBoard and (optionally) W&B, and prints progress."""

    def __init__(
        self,
        run_dir: Path,
        *,
        tensorboard: bool = True,
        wandb_project: str | None = None,
        config: dict[str, Any] | None = None,
        console: Console | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.console = console or Console(stderr=True)
        self._file = (run_dir / "metrics.jsonl").open("a", encoding="utf-8")
        self._tensorboard = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(str(run_dir / "tensorboard"))
        self._wandb = None
        if wandb_project:
            try:
                import wandb
            except ImportError:
                self.console.print(
                    f"[yellow]wandb is not installed; metrics for {wandb_project!r} go to metrics.jsonl and "
                    "TensorBoard only (pip install wandb)"
                )
            else:
                self._wandb = wandb.init(project=wandb_project, config=config, dir=str(run_dir))
        self._started = time.monotonic()

    def write(self, record: dict[str, Any]) -> None:
        """Append one record (it must have "step" and "phase") to every sink."""
        record = {"time_s": round(time.monotonic() - self._started, 3), **record}
        self._file.write(json.dumps(_json_safe(record)) + "\n")
        self._file.flush()
        step = int(record["step"])
        numbers = {
            k: v for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"
        }
        if self._tensorboard is not None:
            for key, value in numbers.items():
                self._tensorboard.add_scalar(f"{record['phase']}/{key}", value, step)
            self._tensorboard.flush()
        if self._wandb is not None:
            self._wandb.log({f"{record['phase']}/{k}": v for k, v in numbers.items()}, step=step)

    def say(self, message: str) -> None:
        """A progress line on the console."""
        elapsed = time.monotonic() - self._started
        self.console.print(f"[dim]{elapsed:7.1f}s[/dim] {message}")

    def close(self) -> None:
        """Flush and close every sink."""
        self._file.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of a run's metrics.jsonl (a torn last line from a crash is skipped)."""
    records = []
    path = Path(run_dir) / "metrics.jsonl"
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def drop_records_after(run_dir: str | Path, step: int) -> int:
    """Remove the records of steps after `step` (and a torn last line) from metrics.jsonl; return how many.

    A run killed after logging step k but before checkpointing it resumes from an earlier checkpoint
    and runs step k again; its first records would otherwise stay next to the new ones. The file is
    rewritten in place (not replaced), so a `RunLog` already appending to it keeps writing to it.
    """
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1
            continue
        if record.get("phase") in ("train", "eval", "validation") and int(record.get("step", 0)) > step:
            dropped += 1
            continue
        kept.append(line)
    if dropped:
        with path.open("r+", encoding="utf-8") as file:
            file.write("".join(line + "\n" for line in kept))
            file.truncate()
    return dropped


def format_reward(value: float | None) -> str:
    """A reward for a console line: signed, three decimals, or "n/a"."""
    return "n/a" if value is None else f"{value:+.3f}"


def step_line(record: dict[str, Any]) -> str:
    """The console line of a training step's record (every mode's: `step_record.step_record`)."""
    loss, gap = record.get("loss"), record.get("logprob_diff_abs_mean")
    trained = (
        "nothing to train (equal returns in every group)" if loss is None else f"loss {loss:.4f} · |Δlogprob| {gap:.2e}"
    )
    reward = format_reward(record.get("reward_mean"))
    mode = "offline " if record.get("offline") else ""
    version = "" if record["policy_version"] is None else f" · v{record['policy_version']}"
    return (
        f"{mode}step {record['step']}: reward {reward} · {trained}{version} · "
        f"{record['time_step_s']:.1f}s (sample {record['time_sample_s']:.1f}s, train {record['time_train_s']:.1f}s)"
    )


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value
