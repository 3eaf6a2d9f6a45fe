"""Make the CrewAI Twenty Questions player learn on a CPU: a supervised warm start on a scripted player's
games, then GRPO through the proxy on the unchanged flow, evaluated on held-out entities.

    python examples/crewai_twenty_questions/learn.py             # the tiny model, one seed
    python examples/crewai_twenty_questions/learn.py --seed 3
    python examples/crewai_twenty_questions/learn.py --quick     # a few small steps, to check the pipeline

The tiny model knows no entity, so each game lists the names the secret is among (`twenty_q/learning.py`
says how entities are split between the warm start, RL and the held-out evaluation).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from twenty_q.env import apply_offline_environment, limit_torch_threads

REPLY_MAX_TOKENS = 16  # "Is it Martin Luther King Jr.?" and the end of the turn are 14 tokens


def build_config(args: argparse.Namespace):
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
        lr_warmup_steps=0 if quick else min(3, steps - 1),  # shorter than the run: --steps 1 is allowed
        lora_rank=16,
        lora_alpha=32,
        # A random tiny model barely moves under a rank-16 LoRA in a CPU budget; its whole weights are small.
        train_full_weights=args.full_weights,
        loss_fn="importance_sampling",
        tis_cap=2.0,
        aggregation="token_mean",
        default_max_tokens=REPLY_MAX_TOKENS,
        concurrency=args.concurrency,
        eval_every=1 if quick else args.eval_every,
        # 80 games measure a success rate to ±0.05 (one standard error): too coarse for a 20-point lift
        eval_group_size=1 if quick else 2,
        final_eval_group_size=1 if quick else 2,
        checkpoint_every=1 if quick else 10,
        missing_reward="drop",
        shuffle_tasks=not args.balanced_batches,
        seed=args.seed,
        tensorboard=False,
        warm_start=WarmStartConfig(
            steps=4 if quick else args.warm_start_steps,
            batch_size=16,
            learning_rate=args.warm_start_learning_rate,
            merge_turns=args.whole_games,
        ),
    )


def rl_tasks(seed: int, balanced_batches: bool) -> list[dict[str, object]]:
    """The RL games: 5 lists per RL secret in position-balanced batches of 8 (taken in order), or with
    `balanced_batches` off 4 lists per secret, which the trainer shuffles (the README's older runs)."""
    from twenty_q.learning import phase_tasks, position_balanced

    if balanced_batches:
        return position_balanced(phase_tasks("rl", 5, seed), seed)
    return phase_tasks("rl", 4, seed)


@dataclass(frozen=True)
class HeldOutGames:
    """One held-out evaluation read back from the run's store: games, success rate, turns used per game."""

    games: int
    success_rate: float
    turns_mean: float


async def held_out_evaluations(store_path: Path) -> list[HeldOutGames]:
    """Every held-out evaluation of the run, in order: the evaluation rollouts grouped by their run of the
    evaluation ("eval<step>-<nonce>-<task>"); a game's turns are its player calls, its success its reward."""
    from agl_bridge.store.sqlite import SQLiteStore
    from agl_bridge.viewer.steps import evaluation_of

    runs: dict[str, list[tuple[bool, int]]] = {}
    async with SQLiteStore(store_path) as store:
        for rollout in await store.list_rollouts():
            evaluation = evaluation_of(rollout.group_id)
            if evaluation is None:
                continue
            rewards = [r.value async for r in store.iter_rewards(rollout.rollout_id)]
            turns = sum([1 async for c in store.iter_llm_calls(rollout.rollout_id) if c.kind == "token"])
            runs.setdefault(evaluation, []).append((sum(rewards) > 0, turns))
    return [
        HeldOutGames(len(games), sum(won for won, _ in games) / len(games), sum(t for _, t in games) / len(games))
        for games in runs.values()
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])

    def switch(flag: str, default: bool, text: str) -> None:
        """An on/off flag: `flag` and `--no-...`."""
        parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=text)

    parser.add_argument("--model", default="tiny", help="tiny (built offline) or a local model directory")
    parser.add_argument("--run-dir", default="runs/twenty_questions_learn")
    parser.add_argument("--steps", type=int, default=None, help="RL steps (default 40, 2 with --quick)")
    parser.add_argument("--batch-size", type=int, default=8, help="secrets per RL step")
    parser.add_argument("--group-size", type=int, default=8, help="games per secret: one GRPO group")
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--warm-start-steps", type=int, default=150)
    parser.add_argument("--warm-start-learning-rate", type=float, default=2e-3)
    switch(
        "--balanced-batches",
        True,
        "every RL batch of 8 puts the secret at each list position once (--no-...: shuffled lists)",
    )
    switch(
        "--whole-games", True, "a warm-start example is a whole scripted game, every reply trained (--no-...: one turn)"
    )
    parser.add_argument(
        "--question-rate", type=float, default=0.8, help="how often the scripted player asks a question"
    )
    switch("--full-weights", True, "train every weight, not a LoRA")
    parser.add_argument(
        "--teacher-tries",
        type=int,
        default=1000,
        help="times the scripted player plays a list, its questions drawn afresh, until it wins it",
    )
    switch(
        "--teacher-wins-every-list",
        True,
        "a list still lost after the tries is played once more without questions (its second half kept)",
    )
    switch(
        "--teacher-uses-answers",
        False,
        "the scripted player rules names out by its questions' answers (--no-...: it guesses in list order)",
    )
    switch(
        "--balanced-held-out",
        True,
        "the held-out lists put the secret at each position equally often (--no-...: as drawn)",
    )
    parser.add_argument(
        "--turn-cost",
        type=float,
        default=0.05,
        help="a won game's reward is 1 less this for every turn after the first (0: 1 for any win)",
    )
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--torch-threads", type=int, default=1, help="CPU threads for torch (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a few small steps, to check the pipeline")
    args = parser.parse_args(argv)
    from twenty_q.learning import MAX_TURNS
    from twenty_q.reward import check_turn_cost

    try:
        check_turn_cost(args.turn_cost, MAX_TURNS)
    except ValueError as error:
        parser.error(str(error))
    return args


def main(argv: list[str] | None = None):
    """Warm start, RL, evaluate; print the table."""
    args = parse_args(argv)
    run_dir = Path(args.run_dir)
    apply_offline_environment(storage_dir=(run_dir / "crewai").resolve())
    limit_torch_threads(args.torch_threads)
    from twenty_q.learning import MAX_TURNS, held_out_tasks, phase_tasks

    os.environ["TWENTYQ_MAX_TOKENS"] = str(REPLY_MAX_TOKENS)
    os.environ["TWENTYQ_MAX_TURNS"] = str(MAX_TURNS)
    os.environ["TWENTYQ_SEARCH"] = "0"
    os.environ["TWENTYQ_TURN_COST"] = str(args.turn_cost)

    from twenty_q.agent import twenty_questions_agent
    from twenty_q.scripted import warm_start_games

    from agl_bridge.train.grpo import GRPOTrainer

    # --quick trains 4 warm-start steps: a list per secret played once is plenty (the full 384 take ~2.5 min to win)
    pairs, won = warm_start_games(
        phase_tasks("warm_start", 1 if args.quick else 4, args.seed),
        args.seed,
        args.question_rate,
        MAX_TURNS,
        uses_answers=args.teacher_uses_answers,
        tries=1 if args.quick else args.teacher_tries,
        then_without_questions=args.teacher_wins_every_list,
    )
    print(f"warm-start data: {len(won)} scripted games, {sum(won)} won: their {len(pairs)} turns")
    trainer = GRPOTrainer(
        build_config(args),
        agent=twenty_questions_agent,
        tasks=rl_tasks(args.seed, args.balanced_batches),
        eval_tasks=held_out_tasks(args.balanced_held_out)[: 4 if args.quick else None],
        warm_start_pairs=pairs,
    )
    summary = trainer.run()

    evaluations = asyncio.run(held_out_evaluations(summary.run_dir / "store.sqlite"))
    write_held_out(summary.run_dir, evaluations, summary.wall_time_s)
    print_table(evaluations, args.seed, summary.wall_time_s)
    return summary


def write_held_out(run_dir: Path, evaluations: list[HeldOutGames], wall_time_s: float) -> Path:
    """run_dir/held_out.json: every held-out evaluation in order (before the warm start, after it, through RL)
    and the run's wall time, for `bench/agent_learning_seeds.py`."""
    path = run_dir / "held_out.json"
    path.write_text(json.dumps({"evaluations": [asdict(e) for e in evaluations], "wall_time_s": wall_time_s}))
    return path


def print_table(evaluations: list[HeldOutGames], seed: int, wall_time_s: float) -> None:
    """Held-out success and turns used before the warm start, after it, and at the end of RL."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Twenty Questions on CrewAI: held-out entities (never trained on), seed {seed}")
    for column in ("phase", "games", "success", "turns used"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    labels = ["before the warm start", "after the warm start (start of RL)"]
    for index, evaluation in enumerate(evaluations):
        if index < len(labels) or index == len(evaluations) - 1:
            label = labels[index] if index < len(labels) else "end of RL"
            table.add_row(
                label, str(evaluation.games), f"{evaluation.success_rate:.3f}", f"{evaluation.turns_mean:.2f}"
            )
    table.add_row("wall time", "", f"{wall_time_s / 60:.1f} min", "")
    Console().print(table)


if __name__ == "__main__":
    main()
