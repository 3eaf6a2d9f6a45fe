"""tinker-cookbook's `sl_loop` then `rl_loop`, unmodified, against `agl-bridge serve-tinker` on the tiny model, offline:
does the supervised loss fall, and does the RL reward rise?

The recipes' hub downloads come from an offline HF_HOME (`agl_bridge/testing/tinker_cookbook.py`): the name
`Qwen/Qwen3-8B` is served by the tiny model; no_robots holds sums answered `\\boxed{0}` or `\\boxed{1}`
(a warm start that teaches the format), gsm8k those sums with every answer 0. `rl_loop` resumes
from `sl_loop`'s last checkpoint (the recipes' own resume) and learns to answer 0. Prints one JSON
line: sl_loop's mean NLL over its first and last 4 batches, rl_loop's reward over its first and last
4 batches (with its default loss, stable_reinforce, unless --loss-fn), the per-batch rewards and
both recipes' wall times. Needs `bash scripts/tinker_cookbook_env.sh`.

    .venv/bin/python bench/tinker_cookbook.py [--rl-batches 24] [--rl-learning-rate 1e-3] [--loss-fn stable_reinforce]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from agl_bridge.proxy.server import bind_socket
from agl_bridge.testing.tinker_cookbook import cookbook_env
from agl_bridge.tinker_api.server import TinkerServer

REPO = Path(__file__).resolve().parents[1]
MODEL = "Qwen/Qwen3-8B"
SL_BATCHES = 32  # cookbook_offline.py's 256 conversations in batches of 8


def main() -> None:
    """Run both recipes and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rl-batches", type=int, default=24)
    parser.add_argument("--rl-learning-rate", type=float, default=1e-3)
    parser.add_argument("--loss-fn", default="stable_reinforce", help="rl_loop's loss (its default: stable_reinforce)")
    args = parser.parse_args()
    site = subprocess.run(
        ["bash", str(REPO / "scripts" / "tinker_cookbook_env.sh")], capture_output=True, text=True, check=True
    ).stdout.strip()
    work = Path(tempfile.mkdtemp(prefix="agl-cookbook-bench-"))
    with TinkerServer(bind_socket("127.0.0.1", 0), work / "root", models={MODEL: "tiny"}) as server:
        env = cookbook_env(site, server.base_url, server.api_key, work / "hf")
        log = work / "run"
        common = [f"base_url={server.base_url}", f"model_name={MODEL}", f"log_path={log}", "save_every=0"]
        sl_s = recipe(env, "sl_loop", *common, "batch_size=8", "learning_rate=1e-2")
        rl_s = recipe(
            env,
            "rl_loop",
            *common,
            "batch_size=4",
            "group_size=8",
            "max_tokens=16",
            f"max_steps={SL_BATCHES + args.rl_batches}",
            f"learning_rate={args.rl_learning_rate}",
            f"loss_fn={args.loss_fn}",
        )
    rows = [json.loads(line) for line in (log / "metrics.jsonl").read_text().splitlines()]
    nll = [row["train_mean_nll"] for row in rows if "train_mean_nll" in row]
    rewards = [row["reward/total"] for row in rows if "reward/total" in row]
    print(
        json.dumps(
            {
                "sl_batches": len(nll),
                "sl_nll_first4": round(statistics.fmean(nll[:4]), 3),
                "sl_nll_last4": round(statistics.fmean(nll[-4:]), 3),
                "sl_wall_s": round(sl_s, 1),
                "rl_loss_fn": args.loss_fn,
                "rl_batches": len(rewards),
                "rl_reward_first4": round(statistics.fmean(rewards[:4]), 3),
                "rl_reward_last4": round(statistics.fmean(rewards[-4:]), 3),
                "rl_rewards": [round(r, 3) for r in rewards],
                "rl_wall_s": round(rl_s, 1),
            }
        )
    )


def recipe(env: dict[str, str], name: str, *arguments: str) -> float:
    """Run one recipe to the end; its wall time in seconds."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", f"tinker_cookbook.recipes.{name}", *arguments], env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        sys.exit(f"{name} failed:\n{result.stderr[-4000:]}")
    return time.monotonic() - started


if __name__ == "__main__":
    main()
