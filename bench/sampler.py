"""Sampler throughput: continuous batching of concurrent requests vs plain batched `generate`.

Prints one JSON line: aggregate new tokens/s for 1, 4, 16 and 64 concurrent requests (tiny model,
64 new tokens each, temperature 1, no early stop) through `HFSampler`, the same for
`model.generate` on a batch of that size, and the two ratios the project promises
(16 concurrent ≥ 5× one request, and ≥ 0.7× batched generate at 16).

    .venv/bin/python bench/sampler.py [--model tiny] [--repeats 3] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from agl_bridge.models.loading import load_causal_lm, load_tokenizer
from agl_bridge.sampler.base import SamplingParams
from agl_bridge.sampler.hf import HFSampler

NEW_TOKENS = 64
CONCURRENCY = (1, 4, 16, 64)


def _sampler_rate(sampler: HFSampler, prompt: list[int], concurrency: int) -> float:
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, stop=[])
    start = time.perf_counter()
    futures = [sampler.submit(prompt, params) for _ in range(concurrency)]
    tokens = sum(len(f.result().sequences[0].tokens) for f in futures)
    return tokens / (time.perf_counter() - start)


def _generate_rate(model: torch.nn.Module, prompt: list[int], batch: int) -> float:
    input_ids = torch.tensor([prompt] * batch)
    start = time.perf_counter()
    with torch.no_grad():
        output = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=True,
            top_k=None,
            pad_token_id=0,
        )
    return (output.shape[1] - len(prompt)) * batch / (time.perf_counter() - start)


def main() -> None:
    """Run the measurement and print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--repeats", type=int, default=3, help="median of this many runs per point")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model = load_causal_lm(args.model)
    tokenizer = load_tokenizer(args.model)
    prompt = tokenizer("Let's play a game. Say you are 42. What do you say?")["input_ids"]
    sampler = HFSampler(model, tokenizer, seed=0)
    try:
        _sampler_rate(sampler, prompt, 4)  # warm-up
        _generate_rate(model, prompt, 4)
        ours = {
            n: statistics.median(_sampler_rate(sampler, prompt, n) for _ in range(args.repeats)) for n in CONCURRENCY
        }
        plain = {
            n: statistics.median(_generate_rate(model, prompt, n) for _ in range(args.repeats)) for n in CONCURRENCY
        }
    finally:
        sampler.close()

    print(
        json.dumps(
            {
                "bench": "sampler",
                "model": args.model,
                "new_tokens": NEW_TOKENS,
                "prompt_tokens": len(prompt),
                "torch_threads": torch.get_num_threads(),
                "sampler_tokens_per_s": {str(n): round(v, 1) for n, v in ours.items()},
                "generate_tokens_per_s": {str(n): round(v, 1) for n, v in plain.items()},
                "speedup_16_vs_1": round(ours[16] / ours[1], 2),
                "sampler_vs_generate_at_16": round(ours[16] / plain[16], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
