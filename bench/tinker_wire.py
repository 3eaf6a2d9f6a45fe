"""The same importance-sampling steps through the Tinker wire (the unmodified `tinker` SDK against
`agl-bridge serve-tinker`, in this process) and in-process (`TrainingClient`), on the tiny model.

Each step: the SDK samples `--group` replies to a prompt from a pinned snapshot, the replies become
importance-sampling datums (the sampler's logprobs, ±1 advantages), and both clients run
forward_backward + optim_step on them with the same LoRA (rank 8, seed 0, unembedding trained, as
the SDK asks by default) and Adam settings. Prints one JSON line: the largest relative difference of
the two losses over the steps, the largest |ratio − 1| of sampler vs trainer probabilities on the
sampled tokens (the wire's trainer logprobs against the wire's sampler logprobs: the on-policy step
must see ratio 1), and the median wall time of a step through the wire and in-process.

Then the wire's own cost, `--calls` times each: a `forward_backward` of one 16-token datum through the
SDK, less the compute the server's client measured for it (its `time_s` metric); and an SDK `sample`
of one token, less the median of the same request to an in-process sampler of the same model.

    .venv/bin/python bench/tinker_wire.py [--steps 5] [--group 8] [--max-tokens 24]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TINKER_TELEMETRY", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import tinker
from tinker import types

from agl_bridge.primitives import AdamParams, Datum, TrainingClient
from agl_bridge.proxy.server import bind_socket
from agl_bridge.sampler.base import SamplingParams
from agl_bridge.sampler.hf import HFSampler
from agl_bridge.tinker_api.server import TinkerServer

PROMPT = "Let's play a game. Say you are 42."


def main() -> None:
    """Run the steps both ways and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="agl-tinker-bench-"))
    adam = dict(learning_rate=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0, grad_clip_norm=1.0)
    loss_gaps, ratio_gaps, wire_s, local_s = [], [], [], []
    with (
        TinkerServer(bind_socket("127.0.0.1", 0), root, models={"Qwen/Qwen3-8B": "tiny"}) as server,
        tinker.ServiceClient(base_url=server.base_url, api_key=server.api_key) as service,
    ):
        training = service.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=8, seed=0).result()
        local = TrainingClient("tiny", lora_rank=8, seed=0, train_unembedding=True)
        prompt = training.get_tokenizer().encode(PROMPT)
        for step in range(args.steps):
            sampler = training.save_weights_and_get_sampling_client().result()
            params = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=step)
            replies = sampler.sample(types.ModelInput.from_ints(prompt), args.group, params).result().sequences
            wire_data, local_data = [], []
            for index, reply in enumerate(replies):
                tokens = prompt + reply.tokens
                advantage = 1.0 if index % 2 == 0 else -1.0
                logprobs = [0.0] * (len(prompt) - 1) + list(reply.logprobs)
                advantages = [0.0] * (len(prompt) - 1) + [advantage] * len(reply.tokens)
                inputs = {"target_tokens": tokens[1:], "logprobs": logprobs, "advantages": advantages}
                wire_data.append(
                    types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)
                )
                weights = [0.0] * (len(prompt) - 1) + [1.0] * len(reply.tokens)
                local_data.append(Datum(tokens[:-1], {**inputs, "weights": weights}))

            started = time.perf_counter()
            wire = training.forward_backward(wire_data, "importance_sampling").result()
            training.optim_step(types.AdamParams(**adam)).result()
            wire_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            ours = local.forward_backward(local_data, "importance_sampling")
            local.optim_step(AdamParams(**adam))
            local_s.append(time.perf_counter() - started)

            loss_gaps.append(
                abs(wire.metrics["loss:sum"] - ours.metrics["loss"]) / max(abs(ours.metrics["loss"]), 1e-12)
            )
            for output, reply in zip(wire.loss_fn_outputs, replies, strict=True):
                trainer = output["logprobs"].to_numpy()[len(prompt) - 1 :]
                ratio_gaps.extend(abs(math.exp(t - s) - 1.0) for t, s in zip(trainer, reply.logprobs, strict=True))
        local.close()
        overhead = wire_overhead(training, service, prompt[:16], args.calls)
    print(
        json.dumps(
            {
                "steps": args.steps,
                "sequences_per_step": args.group,
                "loss_rel_diff_max": max(loss_gaps),
                "sampler_vs_trainer_ratio_minus_1_max": max(ratio_gaps),
                "sampler_vs_trainer_ratio_minus_1_p99": sorted(ratio_gaps)[int(0.99 * (len(ratio_gaps) - 1))],
                "tokens_over_1e-5": sum(gap > 1e-5 for gap in ratio_gaps),
                "tokens_compared": len(ratio_gaps),
                "step_s_wire_median": round(statistics.median(wire_s), 4),
                "step_s_in_process_median": round(statistics.median(local_s), 4),
                **overhead,
            }
        )
    )


def wire_overhead(
    training: tinker.TrainingClient, service: tinker.ServiceClient, tokens: list[int], calls: int
) -> dict[str, float]:
    """p50 milliseconds the wire adds to a small forward_backward and to a one-token sample."""
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )
    fb_extra = []
    for _ in range(calls):
        started = time.perf_counter()
        result = training.forward_backward([datum], "cross_entropy").result()
        fb_extra.append(time.perf_counter() - started - result.metrics["time_s:max"])
    one_token = types.SamplingParams(max_tokens=1, temperature=1.0)
    sdk_s, local_s = [], []
    # Loaded before the server loads its base sampler: transformers cannot load two models at once.
    with HFSampler.from_pretrained("tiny", device="cpu") as local:
        sampler = service.create_sampling_client(base_model="Qwen/Qwen3-8B")
        for _ in range(calls):
            started = time.perf_counter()
            sampler.sample(types.ModelInput.from_ints(tokens), 1, one_token).result()
            sdk_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            local.sample(tokens, SamplingParams(max_tokens=1))
            local_s.append(time.perf_counter() - started)
    return {
        "forward_backward_overhead_ms_p50": round(1000 * statistics.median(fb_extra), 2),
        "sample_overhead_ms_p50": round(1000 * (statistics.median(sdk_s) - statistics.median(local_s)), 2),
        "sample_ms_p50_sdk": round(1000 * statistics.median(sdk_s), 2),
        "sample_ms_p50_in_process": round(1000 * statistics.median(local_s), 2),
    }


if __name__ == "__main__":
    main()
