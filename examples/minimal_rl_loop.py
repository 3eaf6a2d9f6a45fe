"""A minimal RL loop on the training primitives: sample → reward → datums → forward_backward → optim_step → sync.

    python examples/minimal_rl_loop.py                 # the tiny offline model, about ten seconds on a CPU
    python examples/minimal_rl_loop.py --model PATH    # a real model (a GPU is better)

No proxy, no agent, no store: the loop samples token ids itself and scores them with a verifiable
reward — the share of the reply's characters that are digits, for prompts asking for digits only.
Advantages are GRPO's (reward minus the group's mean); groups whose rewards are all equal teach
nothing and are skipped. `agl_bridge.train.grpo` runs the same loop over an unmodified agent.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from dataclasses import dataclass
from typing import Any

from agl_bridge.primitives import AdamParams, Datum, TrainingClient
from agl_bridge.sampler.base import SamplingParams


@dataclass
class Config:
    """The run's settings."""

    model: str = "tiny"
    steps: int = 12
    batch_size: int = 8  # prompts per step
    group_size: int = 8  # samples per prompt: one GRPO group
    max_tokens: int = 16
    learning_rate: float = 5e-3
    lora_rank: int = 16
    seed: int = 0


def get_reward(reply: str) -> float:
    """The share of the reply's characters that are digits (0 for an empty reply): checkable, no judge."""
    return sum(c.isdigit() for c in reply) / len(reply) if reply else 0.0


async def main(config: Config) -> list[dict[str, Any]]:
    """Train for `config.steps` steps; return each step's metrics (also printed)."""
    history: list[dict[str, Any]] = []
    with TrainingClient(config.model, lora_rank=config.lora_rank, seed=config.seed) as training_client:
        tokenizer = training_client.get_tokenizer()
        sampling_client = training_client.save_weights_and_get_sampling_client("step_0")
        sampling_params = SamplingParams(max_tokens=config.max_tokens, temperature=1.0)
        adam_params = AdamParams(learning_rate=config.learning_rate)

        for step in range(config.steps):
            # Sample: a group of completions per prompt (concurrent requests are batched by the sampler).
            questions = [f"Reply with digits only: what is {step} + {i}?" for i in range(config.batch_size)]
            prompts = [
                tokenizer(
                    tokenizer.apply_chat_template(
                        [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
                    ),
                    add_special_tokens=False,
                )["input_ids"]
                for q in questions
            ]
            results = await asyncio.gather(
                *(sampling_client.sample_async(p, sampling_params, num_samples=config.group_size) for p in prompts)
            )

            # Reward, advantages and datums: the prompt is masked out, the sampled tokens carry the advantage.
            datums: list[Datum] = []
            rewards: list[float] = []
            for prompt, result in zip(prompts, results, strict=True):
                group = [get_reward(tokenizer.decode(s.tokens, skip_special_tokens=True)) for s in result.sequences]
                rewards += group
                mean = statistics.fmean(group)
                if max(group) == min(group):
                    continue
                for sequence, reward in zip(result.sequences, group, strict=True):
                    datums.append(
                        Datum.from_sequence(
                            prompt + sequence.tokens,
                            [0] * len(prompt) + [1] * len(sequence.tokens),
                            [None] * len(prompt) + sequence.logprobs,
                            advantages=reward - mean,
                        )
                    )

            metrics: dict[str, Any] = {
                "step": step + 1,
                "reward_mean": statistics.fmean(rewards),
                "datums": len(datums),
            }
            if datums:
                # Train: one step on the whole batch, then hand the new weights to the sampler.
                output = training_client.forward_backward(datums, "importance_sampling", {"tis_cap": 2.0})
                optim = training_client.optim_step(adam_params)
                sampling_client = training_client.save_weights_and_get_sampling_client(f"step_{step + 1}")
                metrics |= {
                    "loss": output.metrics["loss"],
                    "ratio_mean": output.metrics["ratio_mean"],
                    "logprob_diff_abs_max": output.metrics["logprob_diff_abs_max"],
                    "grad_norm": optim.metrics["grad_norm"],
                }
            metrics["policy_version"] = sampling_client.weights_version
            history.append(metrics)
            print(" · ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()))
    return history


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=Config.model, help="tiny (built offline), a model directory or a hub id")
    parser.add_argument("--steps", type=int, default=Config.steps)
    parser.add_argument("--learning-rate", type=float, default=Config.learning_rate)
    args = parser.parse_args()
    asyncio.run(main(Config(model=args.model, steps=args.steps, learning_rate=args.learning_rate)))
