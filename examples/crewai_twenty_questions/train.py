"""Train the CrewAI Twenty Questions player with GRPO through the proxy (the agent's code unchanged).

    python examples/crewai_twenty_questions/train.py                      # the published settings
    python examples/crewai_twenty_questions/train.py --batch-size 2 --group-size 2 --steps 1 --no-eval
    python examples/crewai_twenty_questions/train.py --model Qwen/Qwen3-4B-Instruct-2507   # a GPU

Defaults follow the published Tinker × Agent-lightning run: lr 1e-4, batch 16, group 16, LoRA rank
16, the importance-sampling loss, seed 17. Tasks are the train split of the bundled entities; the
held-out evaluation is the test split (40 entities), every --eval-every steps. The answerer is the
offline deterministic one unless TWENTYQ_ANSWERER_MODEL says otherwise; `--litellm-config FILE`
routes it through the run's proxy (see README.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from twenty_q.env import apply_offline_environment, limit_torch_threads


def build_config(args: argparse.Namespace):
    """The run's GRPOConfig from the command line."""
    from agl_bridge.train.config import GRPOConfig

    return GRPOConfig(
        model=args.model,
        run_dir=args.run_dir,
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        learning_rate=args.learning_rate,
        lora_rank=args.lora_rank,
        lora_alpha=2.0 * args.lora_rank,
        loss_fn="importance_sampling",
        tis_cap=2.0,
        aggregation="token_sum",
        default_max_tokens=args.max_tokens,
        concurrency=args.concurrency,
        rollout_timeout_s=args.rollout_timeout,
        eval_every=args.eval_every,
        eval_group_size=1,
        checkpoint_every=args.checkpoint_every or args.steps,
        missing_reward="drop",
        seed=args.seed,
        tensorboard=not args.no_tensorboard,
        litellm_config=args.litellm_config,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny (built offline), a local model directory, or a hub id")
    parser.add_argument("--run-dir", default="runs/twenty_questions")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16, help="tasks (secrets) per step")
    parser.add_argument("--group-size", type=int, default=16, help="games per secret (a GRPO group)")
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--torch-threads", type=int, default=1, help="CPU threads for torch (0: torch's default)")
    parser.add_argument("--max-tokens", type=int, default=32, help="max tokens of one player reply")
    parser.add_argument("--concurrency", type=int, default=32, help="games played at once")
    parser.add_argument("--rollout-timeout", type=float, default=900.0, help="seconds one game may take")
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--checkpoint-every", type=int, default=None, help="default: only at the end")
    parser.add_argument("--no-eval", action="store_true", help="skip the held-out evaluations")
    parser.add_argument(
        "--search", action="store_true", help="give the player the search tool (off by default: prompt cost)"
    )
    parser.add_argument("--no-tensorboard", action="store_true")
    parser.add_argument(
        "--litellm-config",
        default=None,
        metavar="FILE",
        help="LiteLLM config adding models to the run's proxy; with TWENTYQ_ANSWERER_VIA_PROXY=1 and "
        "TWENTYQ_ANSWERER_MODEL naming one of them, the answerer is called through the proxy (recorded text-only)",
    )
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --run-dir")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None):
    """Train and print where the results are."""
    args = parse_args(argv)
    run_dir = Path(args.run_dir)
    apply_offline_environment(storage_dir=(run_dir / "crewai").resolve())
    os.environ["TWENTYQ_MAX_TOKENS"] = str(args.max_tokens)
    limit_torch_threads(args.torch_threads)
    os.environ["TWENTYQ_SEARCH"] = "1" if args.search else "0"

    from twenty_q.agent import twenty_questions_agent
    from twenty_q.data import tasks_for

    from agl_bridge.train.grpo import GRPOTrainer

    trainer = GRPOTrainer(
        build_config(args),
        agent=twenty_questions_agent,
        tasks=tasks_for("train"),
        eval_tasks=None if args.no_eval else tasks_for("test"),
    )
    summary = trainer.run(resume=args.resume)

    def fmt(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3f}"

    print(
        f"twenty questions: {summary.steps} steps in {summary.wall_time_s / 60:.1f} min · held-out success "
        f"{fmt(summary.eval_start)} → {fmt(summary.eval_end)}"
    )
    print(
        f"metrics: {summary.run_dir / 'metrics.jsonl'} · adapter: {summary.run_dir / 'final_adapter'} · "
        f"store: {summary.run_dir / 'store.sqlite'}"
    )
    return summary


if __name__ == "__main__":
    main()
