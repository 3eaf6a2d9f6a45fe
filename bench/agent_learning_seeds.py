"""The agent examples that learn (issue #31) over several seeds: does RL lift held-out success on every seed?

Runs `bash scripts/learn.sh EXAMPLE --seed N --run-dir RUNS/EXAMPLE/seed_N` once per seed, one after the
other (each run uses both cores), and after each prints one JSON line read from the run's held_out.json:
held-out success after the warm start (the start of RL), at each RL evaluation and at the end, the lift
through RL, turns used, the share of well-formed tool calls where the example measures it, and the wall
time of the whole command (the install check included). A closing line gives the smallest and mean lift
and on how many seeds RL ended above the warm start.

    .venv/bin/python bench/agent_learning_seeds.py twenty-questions [--seeds 0-4] [--runs runs/learn_seeds]
    .venv/bin/python bench/agent_learning_seeds.py tool-agent --seeds 0-4
    .venv/bin/python bench/agent_learning_seeds.py twenty-questions --seeds 1 --warm-start-steps 80  # learn.py's flags
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIFT_TARGET = 0.20


def parse_seeds(text: str) -> list[int]:
    """'0-4' or '0,3,5' → the seeds."""
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def run_seed(example: str, seed: int, run_dir: Path, learn_args: list[str]) -> dict[str, object]:
    """One learn.py run through scripts/learn.sh; what its held_out.json says."""
    started = time.monotonic()
    result = subprocess.run(
        ["bash", "scripts/learn.sh", example, "--seed", str(seed), "--run-dir", str(run_dir), *learn_args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    wall = time.monotonic() - started
    if result.returncode != 0:
        return {"seed": seed, "error": (result.stderr or result.stdout)[-2000:], "wall_min": round(wall / 60, 1)}
    held_out = json.loads((run_dir / "held_out.json").read_text())
    evaluations = held_out["evaluations"]
    start, end = evaluations[1], evaluations[-1]  # [0] is before the warm start
    line: dict[str, object] = {
        "seed": seed,
        "after_warm_start": round(start["success_rate"], 3),
        "through_rl": [round(e["success_rate"], 3) for e in evaluations[2:]],
        "end": round(end["success_rate"], 3),
        "lift": round(end["success_rate"] - start["success_rate"], 3),
        "turns_start_end": [round(start["turns_mean"], 2), round(end["turns_mean"], 2)],
        "end_episodes": end.get("games", end.get("episodes")),  # Twenty Questions counts games
        "wall_min": round(wall / 60, 1),
    }
    if "well_formed_rate" in end:
        line["well_formed_end"] = round(end["well_formed_rate"], 3)
    return line


def main() -> None:
    """Run the seeds, print a line per run and a summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("example", choices=["twenty-questions", "tool-agent"])
    parser.add_argument("--seeds", default="0-4")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "learn_seeds")
    args, learn_args = parser.parse_known_args()  # the rest goes to learn.py
    lines = []
    for seed in parse_seeds(args.seeds):
        line = run_seed(args.example, seed, args.runs / args.example / f"seed_{seed}", learn_args)
        print(json.dumps(line), flush=True)
        lines.append(line)
    lifts = [float(line["lift"]) for line in lines if "lift" in line]  # type: ignore[arg-type]
    if lifts:
        summary = {
            "runs": len(lifts),
            "failed": len(lines) - len(lifts),
            "min_lift": round(min(lifts), 3),
            "mean_lift": round(statistics.fmean(lifts), 3),
            "above_warm_start": sum(lift > 0 for lift in lifts),
            f"lift_at_least_{LIFT_TARGET}": sum(lift >= LIFT_TARGET for lift in lifts),
            "max_wall_min": max(float(line["wall_min"]) for line in lines),  # type: ignore[arg-type]
        }
        print(json.dumps({"summary": summary}), flush=True)


if __name__ == "__main__":
    main()
