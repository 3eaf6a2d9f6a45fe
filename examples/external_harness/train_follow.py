"""Train the hello agent that `harness.py` runs on its own: the follow trainer, which runs no agent.

    python examples/external_harness/train_follow.py --run-dir runs/follow        # terminal 1: serves and trains
    python examples/external_harness/harness.py --endpoint-file runs/follow/endpoint.json   # terminal 2

The same settings as the hello demo (examples/hello_qwen/train.py): a short supervised warm start,
then GRPO on groups of 8 rollouts per number, 8 numbers per step — only here the trainer waits
for the harness's rollouts instead of running the agent, and evaluates on the held-out rollouts
the harness marks `eval`. The same run as a config file for `agl-bridge train --config`:
docs/external-agents.md (without the warm start, whose pairs this script builds).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hello_qwen"))

from agent import prompt_for, split_numbers
from train import build_config as demo_config  # examples/hello_qwen/train.py: the demo's settings

from agl_bridge.train.config import FollowConfig, GRPOConfig
from agl_bridge.train.grpo import GRPOTrainer


def build_config(args: argparse.Namespace) -> GRPOConfig:
    """The demo's settings, in follow mode: the trainer serves on --port and waits for the harness."""
    return dataclasses.replace(
        demo_config(args),
        mode="follow",
        keep_best=False,  # the follow trainer has no validation tasks of its own: the harness marks its evals
        max_staleness=args.max_staleness,
        checkpoint_every=args.checkpoint_every,
        tensorboard=False,
        follow=FollowConfig(port=args.port, min_group_size=2, rollout_idle_timeout_s=120.0, wait_report_s=10.0),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--run-dir", default="runs/follow")
    parser.add_argument("--steps", type=int, default=140)
    parser.add_argument("--batch-size", type=int, default=8, help="groups (numbers) per step")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per number")
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--lr-warmup-steps", type=int, default=0, help="steps over which the rate rises to its peak")
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--warm-start-steps", type=int, default=120)
    parser.add_argument("--no-warm-start", action="store_true", help="RL only (for real instruct models)")
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--port", type=int, default=4000, help="where the harness calls (0 picks a free one)")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sampler", choices=("hf", "vllm"), default="hf", help="as the demo's --sampler")
    args = parser.parse_args(argv)
    args.quick = False  # the demo's --quick shrinks its runner settings; the harness sets the pace here
    train_numbers, _, _ = split_numbers()
    pairs = [(prompt_for(n), f"I'm {n}.") for n in train_numbers]
    summary = GRPOTrainer(build_config(args), warm_start_pairs=pairs).run(resume=args.resume)
    print(
        f"follow run: {summary.steps} steps in {summary.wall_time_s / 60:.1f} min; held-out reward "
        f"{summary.eval_start} → {summary.eval_end}; metrics in {summary.run_dir / 'metrics.jsonl'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
