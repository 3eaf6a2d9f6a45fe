"""Check and measure the in-process HF sampler and the TrainingClient on one device (made for a CUDA GPU).

Both pick `cuda` when it is present; this runs the architecture conformance checks of
tests/conformance/test_families.py with the sampler, the trainer, peft's reference model and
transformers' `generate` all on `--device`, then measures the sampler and the weight sync there:

1. greedy: the sampler's greedy tokens equal transformers' `generate`, for requests alone and for
   requests that join a running batch at different cache lengths and leave it at different steps;
2. logprobs: the logprobs the sampler records while sampling (temperature 1) against
   `TrainingClient.forward`'s for the same tokens: max |gap|;
3. lora_swap: a random LoRA adapter merged live into the sampler scores (and samples) like peft's
   merged model: max |gap|; the adapter must move the logprobs by more than 1e-3 (checks 2 and 3 also
   give the largest |logprob| compared: float32 spacing there, about 1e-6 at 8-16, sizes the noise);
4. grpo_step: two GRPO steps (sample a group of 4, advantages, `forward_backward`, `optim_step`,
   live sync); each step is on-policy (trainer vs sampler logprobs within the tolerance), after the
   sync the sampler samples with the new version and scores like the trainer, and the first step
   moves the policy by more than 1e-4; the wall time of each step (the first includes warm-up);
5. throughput (the `tiny` model): sampler new tokens/s for 1 request and for 16 concurrent
   ones (64 tokens, temperature 1, no early stop; median of 3 after a warm-up), and the latency of
   `save_weights_and_get_sampling_client` (rank-16 LoRA on every linear layer) in ms, p50 and max
   of 10 syncs after a warm-up one (on CUDA the clock stops after `torch.cuda.synchronize()`);
6. device: torch / CUDA / transformers / peft versions, device name, the dtype the model runs in
   (float32, the checkpoint's), the TF32 switches, torch threads, peak GPU memory.

Tolerance: 1e-5 on every device, in float32. PyTorch's defaults keep TF32 off for float32 matmuls
(`torch.backends.cuda.matmul.allow_tf32` False, `torch.get_float32_matmul_precision()` "highest"),
so the kernels a one-token decode and a full-sequence forward pick on a GPU differ only in reduction
order, which at the tiny model's size stays well under 1e-5 on CPU. It has not been measured on a
GPU yet: the JSON records the TF32 switches and every gap, so a failure says whether TF32 was on and
by how much the bound was missed. `--tolerance` overrides it.

Models are the offline tiny ones, built into a temporary directory (no download, no network). The
checks and the measurements always run on the built-in `tiny` model (Qwen3, hidden 128, 2 layers,
vocab 2048). `--families all` (or a list: `--families llama,gemma2`) adds the four checks on every
family of agl_bridge/models/families.py at the conformance suite's size (hidden 64, 2 layers, vocab
512), the size its 1e-5 bound and its "the update moves the policy" premises hold at: measured on
CPU at hidden 128 / vocab 2048, llama, qwen2, mistral, phi3 and gpt2 miss 1e-5 by float noise
(1.05e-5 to 1.8e-5 at |logprob| up to 15), and gemma2 / gemma3 are so peaked that an adapter
hardly moves them. Each check's figures go to stderr as it finishes (so a run cut short still shows
them); stdout gets ONE JSON line at the end. The exit status is 1 if any check failed (a check that
raises counts as failed, with its error in the JSON), else 0.

Imports only torch, transformers, peft, tokenizers, safetensors and the agl_bridge modules it
uses (models, sampler, train): no server, store or tracing dependency.

Usage, from the repo root (about a minute on a GPU for the default family):

    PYTHONPATH=. python3 bench/gpu_check.py [--device cuda] [--families all] [--tolerance 1e-5]
"""

from __future__ import annotations

import os

# Before anything imports transformers / huggingface_hub: they read these at import time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import copy
import functools
import json
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

from agl_bridge.models.families import DEFAULT_FAMILY, FAMILIES
from agl_bridge.models.loading import load_causal_lm, load_tokenizer
from agl_bridge.models.tiny import build_tiny_model
from agl_bridge.primitives import AdamParams, Datum, SamplingClient, TrainingClient
from agl_bridge.sampler.base import SamplingParams
from agl_bridge.sampler.hf import HFSampler

TOLERANCE = 1e-5
"""Largest |sampler logprob - reference logprob| accepted, float32, on CPU and CUDA alike (see the module docs)."""

PROMPT_LENGTHS = (3, 7, 12, 19, 26, 33)
MAX_TOKENS = (24, 9, 17, 5, 21, 13)
"""Different lengths, so rows join the batch at different cache lengths and leave at different steps."""

CONFORMANCE_SIZE = {"hidden": 64, "layers": 2, "vocab": 512}
"""Build arguments of the `--families` models: those of tests/conformance/conftest.py, where the bounds were set."""

WAIT_S = 60
"""Longest wait for one sampler request; a hang fails its check instead of stalling the run."""

NEW_TOKENS = 64
CONCURRENCY = (1, 16)
REPEATS = 3
SYNCS = 10
SYNC_LORA_RANK = 16


# ---------------------------------------------------------------------------- helpers


def _lora_targets(family: str) -> str | list[str]:
    """What the LoRA adapts: every linear layer, but in MoE models only attention (the sampler refuses to
    merge peft's adapters of the stacked expert weights)."""
    return ["q_proj", "k_proj", "v_proj", "o_proj"] if family == "qwen3_moe" else "all-linear"


def _prompts(seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(10, 500, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, stop=[])


def _gap(a: list[float], b: list[float]) -> float:
    if len(a) != len(b):
        raise ValueError(f"logprob lists differ in length: {len(a)} vs {len(b)}")
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def _reference_logprobs(model: Any, tokens: list[int], device: str) -> list[float]:
    """Raw logprob of each token after the first, from a plain forward of `model`."""
    ids = torch.tensor([tokens], device=device)
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(1, ids[0, 1:].unsqueeze(1)).squeeze(1).tolist()


def _synchronize(device: str) -> None:
    """Wait for queued GPU work, so a wall-clock figure covers it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _progress(label: str, figures: dict[str, Any]) -> None:
    print(f"[gpu_check] {label}: {json.dumps(figures)}", file=sys.stderr, flush=True)


def _run_check(label: str, check: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one check; one that raises is recorded as failed with its error, and the run goes on."""
    start = time.perf_counter()
    try:
        figures = check()
    except Exception as exc:  # a one-shot run on a lent machine must report every check, not stop at one
        traceback.print_exc(file=sys.stderr)
        figures = {"pass": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
    figures["check_s"] = round(time.perf_counter() - start, 2)
    _progress(label, figures)
    return figures


# ---------------------------------------------------------------------------- the checks


def check_greedy(model_dir: Path, tokenizer: Any, device: str) -> dict[str, Any]:
    """Sampler greedy ids == `generate`, alone and for requests joining a running batch."""
    model = load_causal_lm(model_dir, device=device)
    prompts = _prompts()
    with HFSampler(model, tokenizer, seed=0) as sampler:
        alone = [
            sampler.submit(p, _greedy(k)).result(timeout=WAIT_S).sequences[0].tokens
            for p, k in zip(prompts, MAX_TOKENS, strict=True)
        ]
        # The first half starts together; the second half joins once the first rows are mid-decode.
        first_tokens = threading.Event()
        counted = [0]

        def on_token(_event: object) -> None:
            counted[0] += 1
            if counted[0] == 3:
                first_tokens.set()

        first = [sampler.submit(prompts[0], _greedy(MAX_TOKENS[0]), on_token=on_token)]
        first += [sampler.submit(p, _greedy(k)) for p, k in zip(prompts[1:3], MAX_TOKENS[1:3], strict=True)]
        if not first_tokens.wait(WAIT_S):
            raise TimeoutError(f"the first batched request sampled no 3 tokens in {WAIT_S} s")
        later = [sampler.submit(p, _greedy(k)) for p, k in zip(prompts[3:], MAX_TOKENS[3:], strict=True)]
        batched = [future.result(timeout=WAIT_S).sequences[0].tokens for future in first + later]
    generated = []
    with torch.no_grad():
        for prompt, max_tokens in zip(prompts, MAX_TOKENS, strict=True):
            # No end-of-sequence ids: generate would suppress them (min_new_tokens) where stop=[] samples them.
            output = model.generate(
                torch.tensor([prompt], device=device),
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                eos_token_id=None,
            )
            generated.append(output[0, len(prompt) :].tolist())
    alone_differ = [i for i, (a, g) in enumerate(zip(alone, generated, strict=True)) if a != g]
    batched_differ = [i for i, (b, a) in enumerate(zip(batched, alone, strict=True)) if b != a]
    return {
        "pass": not alone_differ and not batched_differ,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "requests": len(prompts),
        "alone_differ_from_generate": alone_differ,
        "batched_differ_from_alone": batched_differ,
    }


def check_logprobs(model_dir: Path, tokenizer: Any, device: str, tolerance: float) -> dict[str, Any]:
    """Logprobs recorded while sampling vs `TrainingClient.forward` on the same tokens."""
    params = SamplingParams(max_tokens=20, temperature=1.0, stop=[], seed=7)
    with HFSampler(load_causal_lm(model_dir, device=device), tokenizer, seed=0) as sampler:
        futures = [sampler.submit(p, params, num_samples=2) for p in _prompts(seed=1)]
        samples = [(f.result(timeout=WAIT_S).prompt_tokens, s) for f in futures for s in f.result().sequences]
        with TrainingClient(str(model_dir), lora_rank=4, device=device, sampler=sampler) as client:
            data = [
                Datum.from_sequence(prompt + s.tokens, [0] * len(prompt) + [1] * len(s.tokens)) for prompt, s in samples
            ]
            trained = client.forward(data).loss_fn_outputs
    gap = max(
        _gap(out["logprobs"][len(prompt) - 1 :].tolist(), s.logprobs)
        for (prompt, s), out in zip(samples, trained, strict=True)
    )
    return {
        "pass": gap <= tolerance,
        "max_gap": gap,
        "tolerance": tolerance,
        "largest_abs_logprob": max(abs(x) for _, s in samples for x in s.logprobs),
        "sequences": len(samples),
        "tokens": sum(len(s.tokens) for _, s in samples),
    }


def check_lora_swap(family: str, model_dir: Path, tokenizer: Any, device: str, tolerance: float) -> dict[str, Any]:
    """A random LoRA merged live into the sampler scores and samples like peft's merged model."""
    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=_lora_targets(family))
    peft_model = get_peft_model(load_causal_lm(model_dir, device=device), config)
    for name, param in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    adapter = get_peft_model_state_dict(peft_model)
    merged = copy.deepcopy(peft_model).merge_and_unload()
    prompt = _prompts(seed=2)[4]
    with HFSampler(load_causal_lm(model_dir, device=device), tokenizer, seed=0) as sampler:
        before = sampler.submit(prompt, _greedy(16)).result(timeout=WAIT_S).sequences[0]
        version = sampler.load_lora(adapter, scaling=8 / 4)
        params = SamplingParams(max_tokens=16, temperature=1.0, stop=[], seed=3)
        after = sampler.submit(prompt, params).result(timeout=WAIT_S).sequences[0]
        scored = [float(x) for x in sampler.compute_logprobs(prompt + after.tokens)[1:]]
    expected = _reference_logprobs(merged, prompt + after.tokens, device)
    gap = max(_gap(scored, expected), _gap(after.logprobs, expected[len(prompt) - 1 :]))
    adapted = _reference_logprobs(merged, prompt + before.tokens, device)[len(prompt) - 1 :]
    moved = _gap(adapted, before.logprobs)
    versions_ok = version == 1 and after.token_policy_versions == [1] * len(after.tokens)
    return {
        "pass": gap <= tolerance and moved > 1e-3 and versions_ok,
        "max_gap": gap,
        "tolerance": tolerance,
        "largest_abs_logprob": max(abs(x) for x in expected),
        "adapter_moves_logprobs_by": moved,
        "tokens_carry_new_version": versions_ok,
    }


def _grpo_step(client: TrainingClient, sampling: SamplingClient, prompt: list[int], device: str) -> dict[str, Any]:
    """One GRPO step from `sampling`'s policy; returns its figures and the synced sampling client."""
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=11)
    start = time.perf_counter()
    group = sampling.sample(prompt, params, num_samples=4).sequences
    sampled = time.perf_counter()
    # Any reward that differs within the group: here the mean surprisal of the answer.
    rewards = [-sum(s.logprobs) / len(s.logprobs) for s in group]
    mean = sum(rewards) / len(rewards)
    data = [
        Datum.from_sequence(
            prompt + s.tokens,
            [0] * len(prompt) + [1] * len(s.tokens),
            [None] * len(prompt) + s.logprobs,
            advantages=reward - mean,
        )
        for s, reward in zip(group, rewards, strict=True)
    ]
    metrics = client.forward_backward(data, "importance_sampling").metrics
    client.optim_step(AdamParams(learning_rate=1e-2))
    trained = time.perf_counter()
    synced = client.save_weights_and_get_sampling_client()
    _synchronize(device)
    end = time.perf_counter()
    answer = synced.sample(prompt, params).sequences[0]
    rescored = client.forward(
        [Datum.from_sequence(prompt + answer.tokens, [0] * len(prompt) + [1] * len(answer.tokens))]
    )
    trainer = rescored.loss_fn_outputs[0]["logprobs"][len(prompt) - 1 :].tolist()
    moved = client.forward(data[:1]).loss_fn_outputs[0]["logprobs"][len(prompt) - 1 :].tolist()
    return {
        "synced": synced,
        "on_policy_gap": float(metrics["logprob_diff_abs_max"]),
        "after_sync_gap": _gap(trainer, answer.logprobs),
        "moved_policy_by": _gap(moved, group[0].logprobs),
        "new_version_sampled": synced.weights_version == sampling.weights_version + 1
        and set(answer.token_policy_versions) == {synced.weights_version},
        "step_s": round(end - start, 4),
        "sample_s": round(sampled - start, 4),
        "train_s": round(trained - sampled, 4),
        "sync_s": round(end - trained, 4),
    }


def check_grpo(family: str, model_dir: Path, tokenizer: Any, device: str, tolerance: float) -> dict[str, Any]:
    """Two GRPO steps with live syncs; each on-policy, the sampler scoring like the trainer after each sync."""
    prompt = list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "Say you are 7."}], add_generation_prompt=True, return_dict=False
        )
    )
    with TrainingClient(str(model_dir), lora_rank=4, target_modules=_lora_targets(family), device=device) as client:
        sampling = client.save_weights_and_get_sampling_client()
        steps = []
        for _ in range(2):
            step = _grpo_step(client, sampling, prompt, device)
            sampling = step.pop("synced")
            steps.append(step)
    passed = (
        all(s["on_policy_gap"] <= tolerance and s["after_sync_gap"] <= tolerance for s in steps)
        and all(s["new_version_sampled"] for s in steps)
        and steps[0]["moved_policy_by"] > 1e-4
    )
    return {
        "pass": passed,
        "tolerance": tolerance,
        "max_on_policy_gap": max(s["on_policy_gap"] for s in steps),
        "max_after_sync_gap": max(s["after_sync_gap"] for s in steps),
        "steps": steps,
    }


# ---------------------------------------------------------------------------- the measurements


def _sampler_rate(sampler: HFSampler, prompt: list[int], concurrency: int) -> float:
    """New tokens/s of `concurrency` requests of NEW_TOKENS tokens submitted together."""
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, stop=[])
    start = time.perf_counter()
    futures = [sampler.submit(prompt, params) for _ in range(concurrency)]
    tokens = sum(len(f.result(timeout=WAIT_S).sequences[0].tokens) for f in futures)
    return tokens / (time.perf_counter() - start)


def measure_throughput(model_dir: Path, device: str) -> dict[str, Any]:
    """Sampler tokens/s at 1 and 16 concurrent requests, and the LoRA sync latency."""
    tokenizer = load_tokenizer(model_dir)
    prompt = tokenizer("Let's play a game. Say you are 42. What do you say?")["input_ids"]
    with HFSampler(load_causal_lm(model_dir, device=device), tokenizer, seed=0) as sampler:
        _sampler_rate(sampler, prompt, 4)  # warm-up
        rates = {n: statistics.median(_sampler_rate(sampler, prompt, n) for _ in range(REPEATS)) for n in CONCURRENCY}
    with TrainingClient(str(model_dir), lora_rank=SYNC_LORA_RANK, device=device) as client:
        client.save_weights_and_get_sampling_client()  # creates the client's sampler: not timed
        sync_ms = []
        for _ in range(SYNCS):
            start = time.perf_counter()
            client.save_weights_and_get_sampling_client()
            _synchronize(device)
            sync_ms.append((time.perf_counter() - start) * 1000)
    return {
        "new_tokens": NEW_TOKENS,
        "prompt_tokens": len(prompt),
        "sampler_tokens_per_s": {str(n): round(v, 1) for n, v in rates.items()},
        "speedup_16_vs_1": round(rates[16] / rates[1], 2),
        "lora_sync_ms": {
            "rank": SYNC_LORA_RANK,
            "syncs": SYNCS,
            "p50": round(statistics.median(sync_ms), 2),
            "max": round(max(sync_ms), 2),
        },
    }


def device_facts(device: str) -> dict[str, Any]:
    """What ran the checks: versions, the device, the TF32 switches that decide float32 matmul precision."""
    facts: dict[str, Any] = {
        "device": device,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "python": sys.version.split()[0],
        "torch_threads": torch.get_num_threads(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    if torch.device(device).type == "cuda":
        index = torch.device(device).index or 0
        facts |= {
            "name": torch.cuda.get_device_name(index),
            "capability": ".".join(map(str, torch.cuda.get_device_capability(index))),
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        }
    else:
        facts["name"] = "cpu"
    return facts


# ---------------------------------------------------------------------------- the run


def check_model(family: str, model_dir: Path, device: str, tolerance: float, label: str) -> dict[str, Any]:
    """Run the four checks on the tiny model of `family` in `model_dir`."""
    tokenizer = load_tokenizer(model_dir)
    checks: dict[str, Callable[[], dict[str, Any]]] = {
        "greedy": lambda: check_greedy(model_dir, tokenizer, device),
        "logprobs": lambda: check_logprobs(model_dir, tokenizer, device, tolerance),
        "lora_swap": lambda: check_lora_swap(family, model_dir, tokenizer, device, tolerance),
        "grpo_step": lambda: check_grpo(family, model_dir, tokenizer, device, tolerance),
    }
    return {name: _run_check(f"{label} {name}", check) for name, check in checks.items()}


def _families(value: str) -> list[str]:
    names = list(FAMILIES) if value == "all" else [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in FAMILIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown families {unknown or value!r}: expected 'all' or a comma-separated list of {', '.join(FAMILIES)}"
        )
    return names


def main() -> int:
    """Run the checks and measurements, print the JSON line; 1 if a check failed."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", help="torch device (default: cuda if any)"
    )
    parser.add_argument(
        "--families",
        type=_families,
        default=[],
        help="also check these families at the conformance size: 'all' or a comma-separated list",
    )
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="largest logprob gap accepted")
    args = parser.parse_args()
    start = time.perf_counter()
    facts = device_facts(args.device)
    _progress("device", facts)
    families: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="agl-gpu-check-") as folder:
        tiny_dir = build_tiny_model(Path(folder) / "tiny")
        tiny = check_model(DEFAULT_FAMILY, tiny_dir, args.device, args.tolerance, "tiny")
        throughput = _run_check("throughput", functools.partial(measure_throughput, tiny_dir, args.device))
        for family in args.families:
            family_dir = build_tiny_model(Path(folder) / family, family=family, **CONFORMANCE_SIZE)
            families[family] = check_model(family, family_dir, args.device, args.tolerance, family)
    facts["dtype"] = sorted({checks["greedy"].get("dtype", "?") for checks in [tiny, *families.values()]})
    if torch.device(args.device).type == "cuda":
        facts["peak_memory_mib"] = round(torch.cuda.max_memory_allocated(args.device) / 2**20, 1)
    failed = [f"tiny {name}" for name, figures in tiny.items() if not figures["pass"]]
    failed += [
        f"{family} {name}"
        for family, checks in families.items()
        for name, figures in checks.items()
        if not figures["pass"]
    ]
    if "error" in throughput:
        failed.append("throughput")
    print(
        json.dumps(
            {
                "bench": "gpu_check",
                "passed": not failed,
                "failed": failed,
                "tolerance": args.tolerance,
                "device": facts,
                "tiny": tiny,
                "throughput": throughput,
                "families": families,
                "family_size": CONFORMANCE_SIZE if families else None,
                "wall_s": round(time.perf_counter() - start, 1),
            }
        )
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
