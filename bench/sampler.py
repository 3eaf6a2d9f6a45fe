"""Sampler throughput: continuous batching of concurrent requests vs plain batched `generate`, and vLLM.

Prints one JSON line: aggregate new tokens/s for 1, 4, 16 and 64 concurrent requests (tiny model,
64 new tokens each, temperature 1, no early stop) through `HFSampler`, the same for
`model.generate` on a batch of that size, and the two ratios the project promises
(16 concurrent ≥ 5× one request, and ≥ 0.7× batched generate at 16).

With `--vllm` (run with the vLLM venv's python, see below) the same run adds an in-process
`VLLMSampler` column (float32, eager) at the same concurrencies, and the latency of a live LoRA
sync to it (`load_adapter` of a rank-16 adapter the trainer wrote): p50 and max over `--syncs`.

    .venv/bin/python bench/sampler.py [--model tiny] [--repeats 3] [--threads N]
    PYTHONPATH=. VLLM_CPU_KVCACHE_SPACE=2 $(bash scripts/vllm_env.sh) bench/sampler.py --vllm
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

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


def _vllm_rate(sampler: Any, prompt: list[int], concurrency: int) -> float:
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, stop=[])

    async def run() -> int:
        results = await asyncio.gather(*(sampler.sample_async(prompt, params) for _ in range(concurrency)))
        return sum(len(r.sequences[0].tokens) for r in results)

    start = time.perf_counter()
    tokens = asyncio.run(run())
    return tokens / (time.perf_counter() - start)


def _vllm_column(model_name: str, prompt: list[int], repeats: int, syncs: int) -> dict[str, Any]:
    """vLLM tokens/s per concurrency, and the in-process LoRA sync latency (ms)."""
    from agl_bridge.models.loading import resolve_model_path
    from agl_bridge.primitives.client import TrainingClient
    from agl_bridge.sampler.vllm import VLLMSampler

    path = str(resolve_model_path(model_name))
    with tempfile.TemporaryDirectory() as folder:
        sampler = VLLMSampler(path, enforce_eager=True, max_lora_rank=16, adapter_dir=folder, seed=0)
        try:
            _vllm_rate(sampler, prompt, 4)  # warm-up
            rates = {n: statistics.median(_vllm_rate(sampler, prompt, n) for _ in range(repeats)) for n in CONCURRENCY}
            client = TrainingClient(path, lora_rank=16)
            sync_ms = []
            for version in range(1, syncs + 1):
                adapter = Path(folder) / f"adapter-v{version}"
                client.save_weights_for_sampler(adapter)
                start = time.perf_counter()
                sampler.load_adapter(adapter, version)
                sync_ms.append((time.perf_counter() - start) * 1000)
            client.close()
        finally:
            sampler.close()
    return {
        "vllm_tokens_per_s": {str(n): round(v, 1) for n, v in rates.items()},
        "vllm_lora_sync_ms": {"p50": round(statistics.median(sync_ms), 1), "max": round(max(sync_ms), 1)},
    }


def main() -> None:
    """Run the measurement and print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--repeats", type=int, default=3, help="median of this many runs per point")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--vllm", action="store_true", help="add an in-process vLLM column (run in the vLLM venv)")
    parser.add_argument("--syncs", type=int, default=20, help="LoRA syncs timed with --vllm")
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
    vllm = _vllm_column(args.model, prompt, args.repeats, args.syncs) if args.vllm else {}

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
                **vllm,
            }
        )
    )


if __name__ == "__main__":
    main()
