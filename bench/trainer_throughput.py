"""Trainer tokens/s on a model of a real size, and the time until the sampler has the new weights.

The issue's anchor: a random Qwen3-0.6B-shaped model (hidden 1024, 28 layers, 16 query / 8 key-value
heads of 128, MLP 3072, vocab 151,936, tied embeddings), LoRA r16 on every linear layer, 16K tokens
per sequence, one rank; prime-rl reports 13.3K tokens/s on one H100 for that model. Random weights
(no hub): throughput does not depend on the values.

One step = `forward_backward` (importance sampling, on-policy logprobs from a first `forward`) over
`--sequences` sequences of `--seq-len` tokens + `optim_step`; tokens/s = the step's input tokens /
its median wall time over `--steps` steps after one warm-up step. Then the time to new weights:
`save_weights_and_get_sampling_client` after an `optim_step` (the LoRA merged into the in-process
sampler's copy of the model), p50 / max over `--syncs` syncs after the one that creates the sampler.
On CUDA every clock stops after `torch.cuda.synchronize()`. Prints one JSON line (and the device,
dtype, peak GPU memory).

    PYTHONPATH=. python3 bench/trainer_throughput.py [--device cuda] [--dtype bfloat16] [--seq-len 16384]
        [--sequences 2] [--steps 3] [--syncs 5] [--layers 28]   # on a GPU: ~1 min
    torchrun --standalone --nproc-per-node N bench/trainer_throughput.py --sharding fsdp   # N ranks, FSDP2 shards
    .venv/bin/python bench/trainer_throughput.py --device cpu --dtype float32 --layers 2 --seq-len 512  # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from agl_bridge.models.tiny import build_tiny_model
from agl_bridge.primitives import AdamParams, Datum, TrainingClient
from agl_bridge.primitives.data_parallel import (
    DataParallelTrainingClient,
    join_group_from_env,
    launched_rank,
    serve_worker,
)

QWEN3_0_6B = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1_000_000.0,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
}
"""Qwen/Qwen3-0.6B's config.json, the fields that set its size and cost."""

PROMPT_TOKENS = 512
"""Tokens of each sequence that carry no loss (the prompt); the rest are trained."""


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_model(out: Path, layers: int, dtype: torch.dtype) -> Path:
    """A random Qwen3-0.6B-shaped model (with `layers` blocks) and the tiny tokenizer, in `out`."""
    tokenizer_dir = build_tiny_model(out.parent / "tokenizer")
    config = Qwen3Config(**(QWEN3_0_6B | {"num_hidden_layers": layers}), dtype=dtype)
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).to(dtype).save_pretrained(out)
    for file in tokenizer_dir.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(file, out / file.name)
    return out


def _batch(client: TrainingClient, sequences: int, seq_len: int) -> list[Datum]:
    generator = torch.Generator().manual_seed(0)
    high = client.vocab_size - 10
    tokens = [torch.randint(10, high, (seq_len + 1,), generator=generator).tolist() for _ in range(sequences)]
    mask = [0] * PROMPT_TOKENS + [1] * (seq_len + 1 - PROMPT_TOKENS)
    scored = client.forward([Datum.from_sequence(t, mask) for t in tokens]).loss_fn_outputs
    return [
        Datum.from_sequence(t, mask, [None, *out["logprobs"].tolist()], 1.0 if i % 2 else -1.0)
        for i, (t, out) in enumerate(zip(tokens, scored, strict=True))
    ]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Build the model, time the train steps and the syncs; the figures as a dict."""
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory(prefix="agl-throughput-") as folder:
        model_dir = build_model(Path(folder) / "model", args.layers, dtype)
        settings: dict[str, Any] = {
            "base_model": str(model_dir),
            "lora_rank": args.lora_rank,
            "device": device,
            "dtype": dtype,
            "max_batch_tokens": args.seq_len + 1,
        }
        client = (
            TrainingClient(**settings)
            if args.sharding is None
            else DataParallelTrainingClient(join_group_from_env(), sharding=args.sharding, **settings)
        )
        with client:
            parameters = sum(p.numel() for p in client._model.parameters())
            data = _batch(client, args.sequences, args.seq_len)
            adam = AdamParams(learning_rate=1e-5)
            step_s = []
            for step in range(args.steps + 1):  # step 0 warms up
                _synchronize(device)
                began = time.perf_counter()
                client.forward_backward(data, "importance_sampling")
                client.optim_step(adam)
                _synchronize(device)
                if step:
                    step_s.append(time.perf_counter() - began)
            began = time.perf_counter()
            client.save_weights_and_get_sampling_client()  # creates the sampler (a copy of the base model)
            _synchronize(device)
            first_sync_s = time.perf_counter() - began
            sync_ms = []
            for _ in range(args.syncs):
                client.forward_backward(data[:1], "importance_sampling")
                client.optim_step(adam)
                _synchronize(device)
                began = time.perf_counter()
                client.save_weights_and_get_sampling_client()
                _synchronize(device)
                sync_ms.append((time.perf_counter() - began) * 1000)
    step = statistics.median(step_s)
    figures: dict[str, Any] = {
        "bench": "trainer_throughput",
        "model": f"qwen3-0.6b-shaped (random), {args.layers} layers",
        "parameters": parameters,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": args.dtype,
        "lora_rank": args.lora_rank,
        "ranks": 1 if args.sharding is None else int(os.environ["WORLD_SIZE"]),
        "sharding": args.sharding,
        "seq_len": args.seq_len,
        "sequences_per_step": args.sequences,
        "tokens_per_step": args.sequences * args.seq_len,
        "step_s": round(step, 3),
        "tokens_per_s": round(args.sequences * args.seq_len / step, 1),
        "steps": args.steps,
        "first_sync_s": round(first_sync_s, 3),
        "sync_ms": {"p50": round(statistics.median(sync_ms), 1), "max": round(max(sync_ms), 1), "syncs": args.syncs},
        "torch": torch.__version__,
    }
    if device.type == "cuda":
        figures["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    return figures


def main() -> None:
    """Parse the arguments, measure, print the JSON line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", help="the model's dtype (the LoRA trains in it too)")
    parser.add_argument("--seq-len", type=int, default=16384)
    parser.add_argument("--sequences", type=int, default=2, help="sequences per step")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--syncs", type=int, default=5)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--layers", type=int, default=QWEN3_0_6B["num_hidden_layers"])
    parser.add_argument(
        "--sharding", choices=["replicate", "fsdp"], help="train through a data-parallel group (start with torchrun)"
    )
    args = parser.parse_args()
    if args.sharding is not None and "WORLD_SIZE" not in os.environ:
        parser.error(
            "--sharding needs the ranks torchrun starts: torchrun --nproc-per-node N bench/trainer_throughput.py"
        )
    if launched_rank() not in (None, 0):  # only rank 0 runs the bench; the others serve it
        serve_worker(join_group_from_env())
        return
    print(json.dumps(measure(args)), flush=True)


if __name__ == "__main__":
    main()
