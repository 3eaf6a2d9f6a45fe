"""Data-parallel training on CPU: one train step (forward_backward + optim_step) on 1 rank vs 2 ranks
(gloo), and the share of the 2-rank step spent in communication.

A random Qwen3-shaped model (`--hidden`, `--layers`; default 512 × 4) with LoRA r16 on every linear
layer, `--sequences` sequences of `--tokens` tokens, importance sampling. Each rank gets
`--threads` torch threads (default 1), so "2 ranks" uses twice the cores of "1 rank"; the line
"1 rank, 2×threads" is the same cores in one process — the fair comparison on a small machine.
Prints one JSON line: median step time of each setting over `--steps` steps after 2 warm-up steps,
tokens/s, the speed-up, and `communication_share`: the median share of the 2-rank forward_backward
that rank 0 spent meeting rank 1, all-reducing the gradients and collecting its results (waiting
for the slower rank included), plus the relative difference of the 2-rank loss from the 1-rank
run's: at the first step (the same weights) and the largest over the steps (AdamW magnifies
float-order differences step by step). "2 ranks fsdp" shards the model (FSDP2) instead of
replicating it: its all-gathers and reduce-scatters run inside the passes, so its
`communication_share` counts only the ranks' meeting, and their cost shows in its step time.

    .venv/bin/python bench/data_parallel.py [--steps 8] [--hidden 512] [--layers 4] [--sequences 16] [--tokens 256]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from agl_bridge.models.tiny import TinyModelSpec, build_tiny
from agl_bridge.primitives import AdamParams, Datum, TrainingClient
from agl_bridge.primitives.data_parallel import COMMUNICATION_KEY, DataParallelTrainingClient, spawn_local_group

ADAM = AdamParams(learning_rate=1e-5)


def _batch(vocab: int, sequences: int, tokens: int) -> list[Datum]:
    generator = torch.Generator().manual_seed(0)
    data = []
    for i in range(sequences):
        length = tokens + 1 - (i % 4) * tokens // 8  # uneven lengths: the shares are balanced by tokens
        sequence = torch.randint(10, vocab - 10, (length,), generator=generator).tolist()
        mask = [0] * 16 + [1] * (length - 16)
        logprobs = [None] + [-5.0] * (length - 1)
        data.append(Datum.from_sequence(sequence, mask, logprobs, 1.0 if i % 2 else -1.0))
    return data


def _measure(client: TrainingClient, data: list[Datum], steps: int) -> dict[str, Any]:
    times, communication, losses = [], [], []
    for index in range(steps + 2):
        began = time.perf_counter()
        output = client.forward_backward(data, "importance_sampling")
        client.optim_step(ADAM)
        elapsed = time.perf_counter() - began
        if index >= 2:
            times.append(elapsed)
            communication.append(output.metrics.get(COMMUNICATION_KEY, 0.0) / output.metrics["time_s"])
        losses.append(output.metrics["loss"])
    tokens = sum(d.num_tokens for d in data)
    step = statistics.median(times)
    return {
        "step_s": round(step, 4),
        "tokens_per_s": round(tokens / step),
        "communication_share": round(statistics.median(communication), 4),
        "losses": losses,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the workers inherit it
    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "model"
        build_tiny(model, TinyModelSpec(hidden=args.hidden, layers=args.layers))
        settings: dict[str, Any] = {"base_model": str(model), "lora_rank": 16, "device": "cpu", "seed": 0}
        results: dict[str, Any] = {}
        for name, threads, ranks, sharding in (
            ("1_rank", args.threads, 1, None),
            ("1_rank_2x_threads", 2 * args.threads, 1, None),
            ("2_ranks", args.threads, 2, "replicate"),
            ("2_ranks_fsdp", args.threads, 2, "fsdp"),
        ):
            torch.set_num_threads(threads)
            client = (
                TrainingClient(**settings)
                if sharding is None
                else DataParallelTrainingClient(spawn_local_group(ranks), sharding=sharding, **settings)
            )
            try:
                data = _batch(client.vocab_size, args.sequences, args.tokens)
                results[name] = _measure(client, data, args.steps)
            finally:
                client.close()
    tokens = sum(d.num_tokens for d in _batch(2048, args.sequences, args.tokens))
    reference = results["1_rank"].pop("losses")
    gaps = [abs(a - b) / abs(b) for a, b in zip(results["2_ranks"].pop("losses"), reference, strict=True)]
    fsdp_gaps = [abs(a - b) / abs(b) for a, b in zip(results["2_ranks_fsdp"].pop("losses"), reference, strict=True)]
    results["1_rank_2x_threads"].pop("losses")
    print(
        json.dumps(
            {
                "model": f"qwen3 hidden {args.hidden} x {args.layers} layers, LoRA r16",
                "batch": f"{args.sequences} sequences, {tokens} tokens",
                "threads_per_rank": args.threads,
                **results,
                "speedup_2_ranks_vs_1": round(results["1_rank"]["step_s"] / results["2_ranks"]["step_s"], 3),
                "speedup_2_ranks_vs_1_rank_2x_threads": round(
                    results["1_rank_2x_threads"]["step_s"] / results["2_ranks"]["step_s"], 3
                ),
                "relative_loss_difference_vs_1_rank": {"first_step": gaps[0], "max_over_steps": max(gaps)},
                "fsdp_relative_loss_difference_vs_1_rank": {
                    "first_step": fsdp_gaps[0],
                    "max_over_steps": max(fsdp_gaps),
                },
                "cpu_count": os.cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()
