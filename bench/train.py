"""Training primitives: forward_backward + optim_step throughput, and live weight-sync latency.

Prints one JSON line:

* train: tokens/s of one forward_backward (importance_sampling) + optim_step over 16 sequences of 64
  tokens (tiny model, LoRA r=16 on all linear layers), median over `--steps` steps after warm-up;
* sync: latency of `save_weights_and_get_sampling_client` (p50 / p90 / max over `--syncs` syncs)
  while the in-process sampler keeps `--concurrency` requests in flight, plus the requests served,
  how many saw a swap mid-sequence, and how many were dropped (must be 0);
* loss_overhead: the median time of one forward_backward with each loss / rollout correction against
  plain importance sampling, wall and CPU time (`--loss-rounds` interleaved rounds), and the extra
  share each adds (the target: GSPO and the corrections add <= 5%);
* grpo_step: a short GRPO run (`--grpo-steps` steps of 8 tasks × 8 rollouts of a toy agent through
  the real proxy) and the median share of a step's wall time spent outside sampling and
  forward/backward (converting, advantages, datums, weight sync, bookkeeping), with the time split.

    .venv/bin/python bench/train.py [--model tiny] [--steps 10] [--syncs 20] [--concurrency 4] [--threads N]
        [--loss-rounds 20] [--grpo-steps 6]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import Self

import torch

from agl_bridge.primitives import AdamParams, Datum, TrainingClient
from agl_bridge.sampler.base import SamplingParams

SEQUENCES = 16
TOKENS = 64
PROMPT = 16
LORA_RANK = 16


def _batch(client: TrainingClient) -> list[Datum]:
    """16 on-policy datums of 64 input tokens each: 16 prompt tokens (weight 0), 48 trained ones."""
    generator = torch.Generator().manual_seed(0)
    sequences = [
        torch.randint(10, client.vocab_size - 10, (TOKENS + 1,), generator=generator).tolist() for _ in range(SEQUENCES)
    ]
    mask = [0] * PROMPT + [1] * (TOKENS + 1 - PROMPT)
    scored = client.forward([Datum.from_sequence(s, mask) for s in sequences]).loss_fn_outputs
    return [
        Datum.from_sequence(s, mask, [None, *out["logprobs"].tolist()], 1.0 if i % 2 else -1.0)
        for i, (s, out) in enumerate(zip(sequences, scored, strict=True))
    ]


def _train_rate(client: TrainingClient, data: list[Datum], steps: int) -> dict[str, float]:
    adam = AdamParams(learning_rate=1e-4)
    for _ in range(2):  # warm-up
        client.forward_backward(data, "importance_sampling")
        client.optim_step(adam)
    fb_times, step_times = [], []
    for _ in range(steps):
        start = time.perf_counter()
        client.forward_backward(data, "importance_sampling")
        middle = time.perf_counter()
        client.optim_step(adam)
        fb_times.append(middle - start)
        step_times.append(time.perf_counter() - middle)
    total = statistics.median(f + s for f, s in zip(fb_times, step_times, strict=True))
    return {
        "tokens_per_s": round(SEQUENCES * TOKENS / total, 1),
        "step_ms": round(total * 1000, 2),
        "forward_backward_ms": round(statistics.median(fb_times) * 1000, 2),
        "optim_step_ms": round(statistics.median(step_times) * 1000, 2),
    }


LOSS_VARIANTS: dict[str, tuple[str, dict[str, object] | None]] = {
    "importance_sampling": ("importance_sampling", None),
    "token_tis": ("importance_sampling", {"tis_cap": 2.0}),
    "sequence_tis_mis_geo": (
        "importance_sampling",
        {"tis_cap": 2.0, "correction_level": "sequence", "mis_low": 0.5, "mis_high": 4.0, "geo_low": 0.9},
    ),
    "ppo_decoupled_token_tis": ("ppo", {"tis_cap": 2.0}),
    "gspo": ("gspo", None),
    "gspo_sequence_tis_geo": ("gspo", {"tis_cap": 2.0, "geo_low": 0.9, "geo_high": 1.1}),
}
"""What `--loss-rounds` times: name → (loss_fn, loss_fn_config); the first is the baseline."""


def _loss_overhead(client: TrainingClient, data: list[Datum], rounds: int) -> dict[str, object]:
    """Median wall / CPU ms of one forward_backward per variant, interleaved, and the share each adds."""
    wall: dict[str, list[float]] = {name: [] for name in LOSS_VARIANTS}
    cpu: dict[str, list[float]] = {name: [] for name in LOSS_VARIANTS}
    for index in range(rounds + 1):  # round 0 warms up
        for name, (loss_fn, config) in LOSS_VARIANTS.items():
            began, began_cpu = time.perf_counter(), time.process_time()
            client.forward_backward(data, loss_fn, config)
            if index:
                wall[name].append(time.perf_counter() - began)
                cpu[name].append(time.process_time() - began_cpu)
            client.zero_grad()
    base_wall, base_cpu = statistics.median(wall["importance_sampling"]), statistics.median(cpu["importance_sampling"])
    loss_part = _loss_part_ms()
    out: dict[str, object] = {}
    for name in LOSS_VARIANTS:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        out[name] = {
            "forward_backward_ms": round(w * 1000, 2),
            "cpu_ms": round(c * 1000, 2),
            "extra_share_wall": round(w / base_wall - 1, 4),
            "extra_share_cpu": round(c / base_cpu - 1, 4),
            # The only work that differs between variants, timed alone: a bound that load noise cannot blur.
            "loss_part_cpu_ms": round(loss_part[name], 3),
            "extra_share_bound": round((loss_part[name] - loss_part["importance_sampling"]) / (base_cpu * 1000), 4),
        }
    out["rounds"] = rounds
    return out


def _loss_part_ms(repeats: int = 200) -> dict[str, float]:
    """Median CPU ms of the loss alone (value + its backward to the logprobs) on a batch-shaped [16, 64] input."""
    from agl_bridge.primitives.losses import compute_loss, get_loss, resolve_config

    generator = torch.Generator().manual_seed(0)
    shape = (SEQUENCES, TOKENS)
    weights = (torch.arange(TOKENS) >= PROMPT).float().expand(shape).contiguous()
    sampler = -torch.rand(shape, generator=generator) * 3
    inputs = {"weights": weights, "logprobs": sampler, "advantages": torch.randn(shape, generator=generator) * weights}
    out = {}
    for name, (loss_fn, config) in LOSS_VARIANTS.items():
        spec = get_loss(loss_fn)
        resolved = resolve_config(spec, config)
        times = []
        for _ in range(repeats):
            lp = (sampler + torch.randn(shape, generator=generator) * 0.01).requires_grad_(True)
            began = time.process_time()
            compute_loss(spec, lp, inputs, resolved).loss.backward()
            times.append(time.process_time() - began)
        out[name] = statistics.median(times) * 1000
    return out


class _Load:
    """Keeps `concurrency` sample requests in flight on the sampler until stopped; counts outcomes."""

    def __init__(self, sampler, concurrency: int) -> None:
        self.sampler = sampler
        self.served = self.dropped = self.spanning = self.tokens = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._agent, args=(i,), daemon=True) for i in range(concurrency)]

    def _agent(self, index: int) -> None:
        params = SamplingParams(max_tokens=64, temperature=1.0, stop=[])
        while not self._stop.is_set():
            try:
                sequence = self.sampler.sample([5 + index, 6, 7, 8], params).sequences[0]
            except Exception:
                self.dropped += 1
                continue
            self.served += 1
            self.tokens += len(sequence.tokens)
            self.spanning += len(set(sequence.token_policy_versions)) > 1

    def __enter__(self) -> Self:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)


def _sync_latency(client: TrainingClient, data: list[Datum], syncs: int, concurrency: int) -> dict[str, float]:
    start = time.perf_counter()
    sampling = client.save_weights_and_get_sampling_client()
    create_ms = (time.perf_counter() - start) * 1000
    first_version = sampling.weights_version
    timings = []
    with _Load(sampling.sampler, concurrency) as load:
        time.sleep(0.2)  # let the requests get going
        for _ in range(syncs):
            client.forward_backward(data[:2], "importance_sampling")  # new weights each time, as in training
            client.optim_step(AdamParams(learning_rate=1e-3))
            start = time.perf_counter()
            sampling = client.save_weights_and_get_sampling_client()
            timings.append(time.perf_counter() - start)
            time.sleep(0.02)
    timings_ms = sorted(t * 1000 for t in timings)
    return {
        "p50_ms": round(statistics.median(timings_ms), 2),
        "p90_ms": round(timings_ms[int(0.9 * (len(timings_ms) - 1))], 2),
        "max_ms": round(timings_ms[-1], 2),
        "first_sync_with_sampler_creation_ms": round(create_ms, 1),
        "versions": sampling.weights_version - first_version,
        "concurrent_requests": concurrency,
        "requests_served": load.served,
        "requests_spanning_a_swap": load.spanning,
        "requests_dropped": load.dropped,
    }


def toy_agent(task: str, endpoint) -> float:
    """A one-call agent whose reward is the reply's characters per sampled token."""
    reply = endpoint.openai_client().chat.completions.create(
        model=endpoint.model,
        messages=[{"role": "user", "content": f"Write something about {task}."}],
        max_tokens=16,
        extra_body={"return_token_ids": True},
    )
    return len(reply.choices[0].message.content or "") / max(1, len(reply.choices[0].model_extra["token_ids"]))


def _grpo_overhead(model: str, steps: int) -> dict[str, float]:
    import tempfile

    from agl_bridge.train.config import GRPOConfig
    from agl_bridge.train.grpo import GRPOTrainer
    from agl_bridge.train.run_log import read_metrics

    with tempfile.TemporaryDirectory() as run_dir:
        config = GRPOConfig(
            model=model,
            run_dir=run_dir,
            steps=steps,
            batch_size=8,
            group_size=8,
            learning_rate=1e-3,
            aggregation="token_mean",
            eval_every=10**6,
            checkpoint_every=10**6,
            default_max_tokens=16,
            tensorboard=False,
        )
        GRPOTrainer(config, agent=toy_agent, tasks=[f"topic {i}" for i in range(16)]).run()
        records = [r for r in read_metrics(run_dir) if r["phase"] == "train"][1:]  # the first step warms up

    def median(key: str) -> float:
        return round(statistics.median(r[key] for r in records), 4)

    return {
        "steps_measured": len(records),
        "overhead_share_p50": median("overhead_share"),
        "step_s_p50": median("time_step_s"),
        "sample_s_p50": median("time_sample_s"),
        "forward_backward_s_p50": median("time_forward_backward_s"),
        "convert_s_p50": median("time_convert_s"),
        "sync_s_p50": median("time_sync_s"),
    }


def main() -> None:
    """Run both measurements and print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps (median)")
    parser.add_argument("--syncs", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=4, help="sample requests kept in flight during syncs")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--grpo-steps", type=int, default=6, help="GRPO steps for the overhead share (0 skips it)")
    parser.add_argument("--loss-rounds", type=int, default=20, help="rounds of the loss-overhead timing (0 skips it)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    with TrainingClient(args.model, lora_rank=LORA_RANK, lora_alpha=2 * LORA_RANK) as client:
        data = _batch(client)
        train = _train_rate(client, data, args.steps)
        losses = _loss_overhead(client, data, args.loss_rounds) if args.loss_rounds else None
        sync = _sync_latency(client, data, args.syncs, args.concurrency)
    grpo = _grpo_overhead(args.model, args.grpo_steps) if args.grpo_steps > 1 else None
    print(
        json.dumps(
            {
                "bench": "train",
                "model": args.model,
                "device": str(client.device),
                "torch_threads": torch.get_num_threads(),
                "batch": f"{SEQUENCES}x{TOKENS}",
                "lora_rank": LORA_RANK,
                "loss_fn": "importance_sampling",
                "train": train,
                "loss_overhead": losses,
                "sync": sync,
                "sync_p50_within_100ms": sync["p50_ms"] <= 100,
                "grpo_step": grpo,
            }
        )
    )


if __name__ == "__main__":
    main()
