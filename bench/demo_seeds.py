"""The README's main job over several seeds: does every run meet the promise by the figure its table prints?

Runs `bash scripts/demo.sh --seed N --run-dir RUNS/seed_N` once per seed, one after the other (each
run uses both cores), and after each prints one JSON line read from that run's metrics.jsonl: the
held-out reward at the start of RL, at the end (the figure the table prints), at the last step,
the step whose adapter the run ended with, the evaluation's rollout count and the wall time. A
closing line gives the minimum, mean and how many runs reached the README's +0.8.

    .venv/bin/python bench/demo_seeds.py [--seeds 0-9] [--runs runs/seeds]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMISE = 0.8
END_ROW = re.compile(r"end of RL \((\d+) steps, (last adapter|adapter of step (\d+))\)\s*[│|]\s*([+-]\d+\.\d+)")


def parse_seeds(text: str) -> list[int]:
    """'0-9' or '0,3,5' → the seeds."""
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def run_seed(seed: int, run_dir: Path) -> dict[str, object]:
    """One demo run; what its table and metrics say."""
    started = time.monotonic()
    result = subprocess.run(
        ["bash", "scripts/demo.sh", "--seed", str(seed), "--run-dir", str(run_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(Path.home()), "COLUMNS": "200"},
    )
    wall = time.monotonic() - started
    if result.returncode != 0:
        return {"seed": seed, "error": result.stderr[-2000:], "wall_min": round(wall / 60, 1)}
    end = END_ROW.search(result.stdout)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rl_evals = [r for r in records if r["phase"] == "eval" and r.get("stage") == "rl"]
    return {
        "seed": seed,
        "start": rl_evals[0]["eval_reward"],
        "end_by_table": float(end[4]) if end else None,
        "last_step": rl_evals[-1]["eval_reward"],
        "kept_step": int(end[3]) if end and end[3] else (int(end[1]) if end else None),
        "end_rollouts": rl_evals[-1]["eval_rollouts"],
        "held_out_every_10": [round(r["eval_reward"], 3) for r in rl_evals],
        "wall_min": round(wall / 60, 1),
    }


def main() -> None:
    """Run the seeds, print a line per run and a summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-9")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "seeds")
    args = parser.parse_args()
    ends = []
    for seed in parse_seeds(args.seeds):
        line = run_seed(seed, args.runs / f"seed_{seed}")
        print(json.dumps(line), flush=True)
        if line.get("end_by_table") is not None:
            ends.append(float(line["end_by_table"]))  # type: ignore[arg-type]
    if ends:
        summary = {
            "runs": len(ends),
            "min_end": min(ends),
            "mean_end": round(statistics.fmean(ends), 3),
            f"at_least_{PROMISE}": sum(e >= PROMISE for e in ends),
        }
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
