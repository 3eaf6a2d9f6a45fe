"""Make the LangGraph shop agent learn on a CPU: a supervised warm start on a careless scripted player's episodes,
then GRPO through the proxy on the unchanged agent, evaluated on held-out (quantity, price) pairs.

    python examples/langgraph_tool_agent/learn.py              # the tiny model, one seed
    python examples/langgraph_tool_agent/learn.py --seed 3
    python examples/langgraph_tool_agent/learn.py --quick      # a few small steps, to check the pipeline

`shop/tasks.py` says how tasks are split between the warm start, RL and the held-out evaluation;
`shop/teacher.py` what the warm start learns from.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from shop.agent import REPLY_MAX_TOKENS
from shop.metrics import HeldOutRun

RL_TASKS = 2_000
"""RL tasks a run draws its steps' batches from (each its own price table)."""


def build_config(args: argparse.Namespace) -> Any:
    """The run's GRPOConfig; --quick shrinks everything for a pipeline check."""
    from agl_bridge.train.config import GRPOConfig, WarmStartConfig

    quick = args.quick
    steps = args.steps or (2 if quick else 40)
    return GRPOConfig(
        model=args.model,
        run_dir=args.run_dir,
        steps=steps,
        batch_size=2 if quick else args.batch_size,
        group_size=2 if quick else args.group_size,
        learning_rate=args.learning_rate,
        lr_schedule="cosine",
        lr_final_ratio=0.1,
        lr_warmup_steps=0 if quick else min(3, steps - 1),
        lora_rank=16,
        lora_alpha=32,
        # A random tiny model barely moves under a rank-16 LoRA in a CPU budget (the Twenty Questions example
        # found it); its whole weights are small.
        train_full_weights=args.full_weights,
        loss_fn="importance_sampling",
        tis_cap=2.0,
        aggregation="token_mean",
        default_max_tokens=REPLY_MAX_TOKENS,
        concurrency=args.concurrency,
        eval_every=1 if quick else args.eval_every,
        # 160 episodes: a success rate to about ±0.04 (one standard error), fine enough for a 20-point lift
        eval_group_size=1 if quick else 4,
        final_eval_group_size=1 if quick else 4,
        checkpoint_every=1 if quick else 10,
        missing_reward="drop",
        seed=args.seed,
        tensorboard=False,
        warm_start=WarmStartConfig(
            # --quick: enough for the format of a tool call, so that its episodes have several turns to check.
            steps=30 if quick else args.warm_start_steps,
            batch_size=16,
            learning_rate=args.warm_start_learning_rate,
            # An episode's three calls as one example: each step then has every copied value of 16 episodes.
            merge_turns=True,
        ),
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny (built offline) or a local model directory")
    parser.add_argument("--run-dir", default="runs/langgraph_tool_agent")
    parser.add_argument("--steps", type=int, default=None, help="RL steps (default 40, 2 with --quick)")
    parser.add_argument("--batch-size", type=int, default=8, help="tasks per RL step")
    parser.add_argument("--group-size", type=int, default=8, help="episodes per task: one GRPO group")
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--warm-start-steps", type=int, default=600)
    parser.add_argument("--warm-start-learning-rate", type=float, default=1e-3)
    parser.add_argument(
        "--warm-start-episodes", type=int, default=3000, help="the scripted player's episodes (20 with --quick)"
    )
    parser.add_argument(
        "--shortcut-rate",
        type=float,
        default=0.5,
        help="how often the scripted player skips a tool and guesses, at each decision",
    )
    parser.add_argument(
        "--full-weights", action=argparse.BooleanOptionalAction, default=True, help="train every weight, not a LoRA"
    )
    parser.add_argument(
        "--copy-pretrain",
        action="store_true",
        help="start from the model pre-trained to copy (agl_bridge.models.copying; built once, ~3 min, then cached)",
    )
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--torch-threads", type=int, default=1, help="CPU threads for torch (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a few small steps, to check the pipeline")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Any:
    """Warm-start data, warm start, RL, evaluations; print the table."""
    started = time.monotonic()
    args = parse_args(argv)
    if args.torch_threads > 0:
        # On a small machine shared with other jobs, torch's default (a thread per core) spins against them.
        import torch

        torch.set_num_threads(args.torch_threads)
    from shop.agent import shop_agent
    from shop.metrics import held_out_evaluations
    from shop.tasks import held_out_tasks, phase_tasks
    from shop.teacher import warm_start_episodes

    from agl_bridge.models.loading import load_tokenizer
    from agl_bridge.train.grpo import GRPOTrainer

    if args.copy_pretrain:
        from agl_bridge.models.copying import pretrain_copying

        args.model = str(pretrain_copying(args.model))
    episodes = 20 if args.quick else args.warm_start_episodes
    t0 = time.monotonic()
    pairs, outcomes = warm_start_episodes(
        phase_tasks("warm_start", episodes, args.seed), args.seed, args.shortcut_rate, load_tokenizer(args.model)
    )
    right = sum(o.reward > 0 for o in outcomes)
    print(
        f"warm-start data: {len(outcomes)} scripted episodes (shortcut rate {args.shortcut_rate}), {right} right: "
        f"their {len(pairs)} model calls, all trained on ({time.monotonic() - t0:.1f} s)"
    )
    trainer = GRPOTrainer(
        build_config(args),
        agent=shop_agent,
        tasks=phase_tasks("rl", RL_TASKS, args.seed),
        eval_tasks=held_out_tasks()[: 4 if args.quick else None],
        warm_start_pairs=pairs,
    )
    summary = trainer.run()
    evaluations = asyncio.run(held_out_evaluations(summary.run_dir / "store.sqlite"))
    logged = eval_labels(summary.run_dir / "metrics.jsonl")
    labels = [logged[i] if i < len(logged) else f"evaluation {i + 1}" for i in range(len(evaluations))]
    wall_time_s = time.monotonic() - started
    write_held_out(summary.run_dir, evaluations, labels, wall_time_s)
    print_table(evaluations, labels, args.seed, wall_time_s)
    return summary


def write_held_out(run_dir: Path, evaluations: list[HeldOutRun], labels: list[str], wall_time_s: float) -> Path:
    """run_dir/held_out.json: every held-out evaluation in order (before the warm start, after it, through RL),
    labelled, and the whole process's wall time."""
    path = run_dir / "held_out.json"
    runs = [{"label": label, **asdict(run)} for label, run in zip(labels, evaluations, strict=True)]
    path.write_text(json.dumps({"evaluations": runs, "wall_time_s": wall_time_s}, indent=1))
    return path


def eval_labels(metrics: Path) -> list[str]:
    """A label for each held-out evaluation the run logged, in order."""
    labels = []
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        if record.get("phase") != "eval":
            continue
        if record.get("stage") == "before_warm_start":
            labels.append("before the warm start")
        elif record["step"] == 0:
            labels.append("after the warm start (start of RL)")
        else:
            labels.append(f"after RL step {record['step']}")
    return labels


def print_table(evaluations: list[HeldOutRun], labels: list[str], seed: int, wall_time_s: float) -> None:
    """Held-out success, well-formed tool calls, turns used and why episodes ended, at every evaluation."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"LangGraph shop agent: held-out (quantity, price) pairs, never trained on; seed {seed}")
    columns = ("phase", "episodes", "success", "tool calls well-formed", "turns used", "both tools used", "endings")
    for column in columns:
        table.add_column(column, justify="left" if column in ("phase", "endings") else "right")
    for label, run in zip(labels, evaluations, strict=True):
        endings = ", ".join(f"{reason} {count}" for reason, count in sorted(run.reasons.items(), key=lambda r: -r[1]))
        table.add_row(
            label,
            str(run.episodes),
            f"{run.success_rate:.3f}",
            f"{100 * run.well_formed_rate:.1f} %",
            f"{run.turns_mean:.2f}",
            f"{100 * run.both_tools_rate:.1f} %",
            endings,
        )
    table.add_row("wall time", "", f"{wall_time_s / 60:.1f} min", "", "", "", "the whole process")
    Console().print(table)


if __name__ == "__main__":
    main()
