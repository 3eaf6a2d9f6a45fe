"""Train the hello agent that `harness.py` runs on its own: the follow trainer, which runs no agent.

    python examples/external_harness/train_follow.py --run-dir runs/follow        # terminal 1: serves and trains
    python examples/external_harness/harness.py --endpoint-file runs/follow/endpoint.json   # terminal 2

The same settings as the hello demo (examples/hello_qwen/train.py): a short supervised warm start on
one half of the training numbers, then GRPO on groups of 8 rollouts per number, 16 numbers per step,
on the other half (the harness picks them), with PPO's clipped loss for the samples of older weights
(see `build_config`) — only here the trainer waits
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

from agent import split_numbers, split_warm_start_and_rl, warm_start_pairs
from train import build_config as demo_config  # examples/hello_qwen/train.py: the demo's settings

from agl_bridge.train.config import FollowConfig, GRPOConfig
from agl_bridge.train.grpo import GRPOTrainer


def build_config(args: argparse.Namespace) -> GRPOConfig:
    """The demo's settings, in follow mode: the trainer serves on --port and waits for the harness."""
    return dataclasses.replace(
        demo_config(args),
        mode="follow",
        # The harness samples while the trainer trains, so a step's rollouts come from the policy one or two
        # versions back. PPO's clip bounds how far one step moves on such tokens; with the demo's unclipped
        # importance ratio (a cap of 2) a token growing from version to version ("" for any number: reward 0,
        # above a wrong number's -1) got up to twice the push and one run in four fell into empty replies.
        # Five runs of 60 steps on a loaded machine rose by 0.63-0.82 with the clip, 0.30-0.36 without.
        loss_fn="ppo",
        # The demo's held-out evaluation is the online run's; the follow trainer logs the evals the harness marks.
        eval_every=GRPOConfig.eval_every,
        eval_group_size=GRPOConfig.eval_group_size,
        final_eval_group_size=GRPOConfig.final_eval_group_size,
        max_staleness=args.max_staleness,
        checkpoint_every=args.checkpoint_every,
        tensorboard=False,
        follow=FollowConfig(port=args.port, min_group_size=2, rollout_idle_timeout_s=120.0, wait_report_s=10.0),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--run-dir", default="runs/follow")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16, help="groups (numbers) per step: the harness's")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per number")
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--lr-warmup-steps", type=int, default=10, help="steps over which the rate rises to its peak")
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--warm-start-steps", type=int, default=160)
    parser.add_argument("--no-warm-start", action="store_true", help="RL only (for real instruct models)")
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--port", type=int, default=4000, help="where the harness calls (0 picks a free one)")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sampler", choices=("hf", "vllm"), default="hf", help="as the demo's --sampler")
    args = parser.parse_args(argv)
    args.quick = False  # the demo's --quick shrinks its runner settings; the harness sets the pace here
    warm_numbers, _ = split_warm_start_and_rl(split_numbers()[0])
    summary = GRPOTrainer(build_config(args), warm_start_pairs=warm_start_pairs(warm_numbers)).run(resume=args.resume)
    print(
        f"follow run: {summary.steps} steps in {summary.wall_time_s / 60:.1f} min; held-out reward "
        f"{summary.eval_start} → {summary.eval_end}; metrics in {summary.run_dir / 'metrics.jsonl'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
