"""Evaluate a Twenty Questions player: success rate overall and per category, turns used, final states.

    python examples/crewai_twenty_questions/evaluate.py                          # tiny model, test split
    python examples/crewai_twenty_questions/evaluate.py --adapter runs/twenty_questions/final_adapter
    python examples/crewai_twenty_questions/evaluate.py --base-url https://api.openai.com/v1 \\
        --model gpt-4o-mini --api-key $OPENAI_API_KEY                            # a baseline, any server

With no --base-url the model is served here by agl_bridge's proxy (token sampler in this process,
every call recorded in OUT_DIR/store.sqlite); with --base-url the player talks to that
OpenAI-compatible server directly. The answerer is the offline deterministic one unless
TWENTYQ_ANSWERER_MODEL says otherwise. Writes OUT_DIR/games.jsonl (one final game state a line) and
OUT_DIR/summary.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from twenty_q.env import apply_offline_environment, limit_torch_threads


@dataclass(frozen=True)
class DirectEndpoint:
    """An OpenAI-compatible endpoint outside agl_bridge (no rollout, no tracing)."""

    base_url: str
    api_key: str
    model: str


def summarize(states: list[dict[str, Any]]) -> dict[str, Any]:
    """Success overall and per category, and turns used (all games, and won games)."""
    by_category: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for state in states:
        by_category[state["category"]].append(state)

    def rate(games: list[dict[str, Any]]) -> float | None:
        return sum(bool(g["guessed"]) for g in games) / len(games) if games else None

    won = [s["turn"] for s in states if s["guessed"]]
    return {
        "games": len(states),
        "success_rate": rate(states),
        "per_category": {c: {"games": len(g), "success_rate": rate(g)} for c, g in sorted(by_category.items())},
        "turns_mean": statistics.fmean(s["turn"] for s in states) if states else None,
        "turns_mean_when_won": statistics.fmean(won) if won else None,
        "wasted_turns_mean": statistics.fmean(sum(t["wasted"] for t in s["history"]) for s in states)
        if states
        else None,
        "tool_calls_mean": statistics.fmean(s["tool_calls"] for s in states) if states else None,
    }


def print_summary(summary: dict[str, Any], wall_s: float) -> None:
    """The figures as a short table."""

    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{100 * value:5.1f}%"

    if not summary["games"]:
        print(f"no game finished ({wall_s:.1f}s)")
        return
    print(
        f"games {summary['games']} · success {pct(summary['success_rate'])} · turns used "
        f"{summary['turns_mean']:.1f} (won: {summary['turns_mean_when_won'] or 0:.1f}) · wasted "
        f"{summary['wasted_turns_mean']:.1f} · tool calls {summary['tool_calls_mean']:.1f} · {wall_s:.1f}s"
    )
    for category, figures in summary["per_category"].items():
        print(f"  {category:22} {pct(figures['success_rate'])}  ({figures['games']} games)")


def play_direct(tasks: list[dict[str, str]], endpoint: DirectEndpoint, concurrency: int) -> list[dict[str, Any]]:
    """Games against an outside server, `concurrency` at a time."""
    from twenty_q.agent import play_game

    def one(task: dict[str, str]) -> dict[str, Any]:
        return play_game(task, endpoint).summary()

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, tasks))


def play_through_proxy(tasks: list[dict[str, str]], args: argparse.Namespace, out_dir: Path) -> list[dict[str, Any]]:
    """Games against a model served by agl_bridge's proxy in this process (tracing and recording on)."""
    from twenty_q.agent import play_game
    from twenty_q.tracing import enable_crewai_tracing

    from agl_bridge import emit_reward
    from agl_bridge.models.loading import load_causal_lm, load_tokenizer, resolve_model_path, served_model_name
    from agl_bridge.proxy.server import ProxyServer
    from agl_bridge.runner import Runner, RunnerConfig
    from agl_bridge.sampler.hf import HFSampler
    from agl_bridge.store.sqlite import SQLiteStore

    states: dict[str, dict[str, Any]] = {}

    def agent(task: dict[str, str], endpoint: Any) -> None:
        # The training agent plus one line: keep the final state for the report.
        tracing = enable_crewai_tracing(endpoint)
        state = play_game(task, endpoint)
        states[endpoint.rollout_id] = state.summary()
        emit_reward(1.0 if state.guessed else 0.0)
        if tracing is not None:
            tracing.force_flush(5_000)

    path = resolve_model_path(args.model)
    tokenizer = load_tokenizer(path)
    model = load_causal_lm(path)
    if args.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.adapter).merge_and_unload()
    sampler = HFSampler(model, tokenizer, seed=args.seed, max_batch_size=max(64, args.concurrency))
    store_path = out_dir / "store.sqlite"
    proxy = ProxyServer(
        sampler=sampler,
        tokenizer=tokenizer,
        store_path=store_path,
        model_name=served_model_name(args.model),
        port=0,
        default_max_tokens=args.max_tokens,
    )

    async def run() -> list[Any]:
        async with SQLiteStore(store_path) as store:
            runner = Runner(
                agent,
                server_url=proxy.base_url,
                api_key=proxy.api_key,
                model=proxy.model_name,
                store=store,
                config=RunnerConfig(group_size=1, concurrency=args.concurrency, timeout_s=args.rollout_timeout),
            )
            try:
                return await runner.run(tasks, group_prefix="eval")
            finally:
                runner.close()

    try:
        proxy.start()
        outcomes = asyncio.run(run())
    finally:
        proxy.stop()
        sampler.close()
    failed = [o for o in outcomes if o.rollout_id not in states]
    for outcome in failed:
        print(
            f"rollout {outcome.rollout_id} ({outcome.task['secret']}) {outcome.status.value}: {outcome.error}",
            file=sys.stderr,
        )
    return [states[o.rollout_id] for o in outcomes if o.rollout_id in states]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="test", choices=("test", "train"))
    parser.add_argument("--limit", type=int, default=None, help="only the first N entities of the split")
    parser.add_argument(
        "--model",
        default="tiny",
        help="served here: tiny / a model dir / hub id; with --base-url: the remote model name",
    )
    parser.add_argument("--adapter", default=None, help="a trained LoRA adapter directory (e.g. RUN_DIR/final_adapter)")
    parser.add_argument("--base-url", default=None, help="an OpenAI-compatible server to evaluate instead (a baseline)")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "none"))
    parser.add_argument("--out-dir", default="runs/twenty_questions_eval")
    parser.add_argument("--concurrency", type=int, default=40)
    parser.add_argument("--torch-threads", type=int, default=1, help="CPU threads for torch (0: torch's default)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--search", action="store_true", help="give the player the search tool (off by default: prompt cost)"
    )
    parser.add_argument("--rollout-timeout", type=float, default=900.0)
    parser.add_argument("--seed", type=int, default=17)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Play the split, write the JSONL of final states and the summary, print the figures."""
    args = parse_args(argv)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    apply_offline_environment(storage_dir=(out_dir / "crewai").resolve())
    os.environ["TWENTYQ_MAX_TOKENS"] = str(args.max_tokens)
    limit_torch_threads(args.torch_threads)
    os.environ["TWENTYQ_SEARCH"] = "1" if args.search else "0"
    from twenty_q.data import tasks_for

    tasks = tasks_for(args.split)[: args.limit]
    started = time.monotonic()
    if args.base_url:
        states = play_direct(tasks, DirectEndpoint(args.base_url, args.api_key, args.model), args.concurrency)
    else:
        states = play_through_proxy(tasks, args, out_dir)
    wall = time.monotonic() - started
    with (out_dir / "games.jsonl").open("w") as handle:
        for state in states:
            handle.write(json.dumps(state) + "\n")
    summary = {
        **summarize(states),
        "wall_time_s": round(wall, 2),
        "model": args.model,
        "adapter": args.adapter,
        "base_url": args.base_url,
        "split": args.split,
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print_summary(summary, wall)
    print(f"final states: {out_dir / 'games.jsonl'} · summary: {out_dir / 'summary.json'}")
    return summary


if __name__ == "__main__":
    main()
