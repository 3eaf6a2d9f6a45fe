"""Time the CrewAI Twenty Questions example on the tiny model: one training step, one evaluation.

    python bench/crewai_twenty_questions.py                 # both figures
    python bench/crewai_twenty_questions.py --only train    # or --only eval

1. One full GRPO step, batch 2 × group 2 (4 games of up to 20 turns through the proxy, convert,
   train, sync), as `train.py --batch-size 2 --group-size 2 --steps 1 --no-eval` — target ≤ 5 min.
2. The evaluation of the 40 test entities with the offline answerer (`evaluate.py`) — target ≤ 3 min.

Each runs in its own process (LiteLLM's proxy is one per process); the figures are the process wall
time (imports, model and proxy start-up included) and, from the run's own records, the step time
and the games' wall time. The machine's load average is printed with them: on a shared 2-core box
it moves the figures a lot.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "crewai_twenty_questions"


def run(command: list[str], cwd: Path) -> float:
    """Run a command, fail loudly, return its wall time in seconds."""
    started = time.monotonic()
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env={**os.environ, "COLUMNS": "160"})
    wall = time.monotonic() - started
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({result.returncode}):\n{(result.stdout + result.stderr)[-3000:]}")
    return wall


def bench_train(work: Path) -> dict[str, float]:
    """One training step, batch 2 × group 2."""
    run_dir = work / "train"
    wall = run(
        [
            sys.executable,
            str(EXAMPLE / "train.py"),
            "--batch-size",
            "2",
            "--group-size",
            "2",
            "--steps",
            "1",
            "--no-eval",
            "--no-tensorboard",
            "--run-dir",
            str(run_dir),
        ],
        work,
    )
    step = next(
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if json.loads(line).get("phase") == "train"
    )
    return {
        "process_wall_s": wall,
        "step_s": step["time_step_s"],
        "sample_s": step["time_sample_s"],
        "train_s": step["time_train_s"],
        "reward_mean": step["reward_mean"],
        "segments": step.get("segments"),
        **bench_train_compute(run_dir),
    }


def bench_train_compute(run_dir: Path) -> dict[str, float]:
    """forward_backward + optim_step on the step's own trajectories with forced ±1 advantages.

    The random tiny model wins no game, so every GRPO group has equal returns and the real step has
    nothing to train (`time_train_s` 0). This times the training compute the step would have spent
    had the rewards differed: same sequences, same loss, same optimizer.
    """
    import asyncio

    from agl_bridge.convert import convert_store
    from agl_bridge.models.loading import resolve_model_path
    from agl_bridge.primitives.client import AdamParams, TrainingClient
    from agl_bridge.store.sqlite import SQLiteStore
    from agl_bridge.train.datums import datums_for

    async def trajectories() -> list:
        async with SQLiteStore(run_dir / "store.sqlite") as store:
            return [t async for t in convert_store(store)]

    import torch

    torch.set_num_threads(1)  # as train.py's default (--torch-threads 1)
    found = asyncio.run(trajectories())
    datums = datums_for([(t, 1.0 if i % 2 else -1.0) for i, t in enumerate(found)], "token_sum")
    client = TrainingClient(resolve_model_path("tiny"), lora_rank=16, lora_alpha=32.0, seed=17)
    try:
        started = time.monotonic()
        client.forward_backward(datums, "importance_sampling", {"tis_cap": 2.0})
        client.optim_step(AdamParams(learning_rate=1e-4))
        compute = time.monotonic() - started
    finally:
        client.close()
    tokens = sum(len(d.loss_fn_inputs["weights"]) for d in datums)
    return {"forced_train_s": compute, "datums": len(datums), "tokens": tokens}


def bench_eval(work: Path) -> dict[str, float]:
    """The 40 test entities with the offline answerer."""
    out_dir = work / "eval"
    wall = run([sys.executable, str(EXAMPLE / "evaluate.py"), "--out-dir", str(out_dir)], work)
    summary = json.loads((out_dir / "summary.json").read_text())
    return {
        "process_wall_s": wall,
        "games_wall_s": summary["wall_time_s"],
        "games": summary["games"],
        "success_rate": summary["success_rate"],
        "turns_mean": summary["turns_mean"],
    }


def main() -> None:
    """Run the chosen benchmarks and print the figures with the load average."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("train", "eval"), default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-twenty-q-") as tmp:
        work = Path(tmp)
        results: dict[str, dict[str, float]] = {}
        for name, bench in (("train", bench_train), ("eval", bench_eval)):
            if args.only in (None, name):
                load = os.getloadavg()
                results[name] = {
                    **bench(work),
                    "load_before": round(load[0], 2),
                    "load_after": round(os.getloadavg()[0], 2),
                }
    cores = os.cpu_count()
    if "train" in results:
        r = results["train"]
        print(
            f"train step (batch 2 × group 2): {r['process_wall_s']:.1f}s process wall, step {r['step_s']:.1f}s "
            f"(sample {r['sample_s']:.1f}s, train {r['train_s']:.1f}s; forced ±1 advantages: forward_backward + "
            "optim_step "
            f"{r['forced_train_s']:.1f}s on {r['datums']} sequences / {r['tokens']} tokens) · target ≤ 300s · load "
            f"{r['load_before']}→{r['load_after']} on {cores} cores"
        )
    if "eval" in results:
        r = results["eval"]
        print(
            f"evaluation ({r['games']} test entities): {r['process_wall_s']:.1f}s process wall, games "
            f"{r['games_wall_s']:.1f}s "
            f"· success {r['success_rate']:.3f} · turns {r['turns_mean']:.1f} · target ≤ 180s · load "
            f"{r['load_before']}→{r['load_after']} on {cores} cores"
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
