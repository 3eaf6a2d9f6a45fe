"""TRL's GRPOTrainer on the comparison workload; run by `bench/grpo_vs_trl.py` with the Python of TRL's own venv.

It imports nothing of agl_bridge (TRL pins its own transformers and accelerate). Prints one JSON
line: the wall time of every training step (generation, reward, forward/backward, optimizer) and
TRL's own logged generation time where it reports one.

    <trl venv>/bin/python bench/_trl_grpo_step.py --model DIR --steps 8 [--prompts 4] [--group 4] [--tokens 32]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer


class StepTimes(TrainerCallback):
    """Wall time of each optimizer step."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.logs: list[dict[str, float]] = []
        self._start = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self._start)

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


def characters(completions, **_):
    """The reward: characters of the reply / 100."""
    return [len(c[0]["content"] if isinstance(c, list) else c) / 100 for c in completions]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tasks = [{"prompt": [{"role": "user", "content": f"Write something about topic {i}."}]} for i in range(64)]
    timer = StepTimes()
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=args.prompts * args.group,
            num_generations=args.group,
            max_completion_length=args.tokens,
            max_steps=args.steps,
            learning_rate=1e-4,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            bf16=False,
            temperature=1.0,
            seed=0,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=characters,
            args=config,
            train_dataset=Dataset.from_list(tasks),
            processing_class=tokenizer,
            peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"),
            callbacks=[timer],
        )
        trainer.train()
    generation = [log.get("timing/generation") or log.get("generation_time") for log in timer.logs]
    print(
        json.dumps(
            {
                "step_s": timer.times,
                "generation_s": [g for g in generation if g is not None],
                "torch_threads": torch.get_num_threads(),
                "log_keys": sorted({k for log in timer.logs for k in log}),
            }
        )
    )


if __name__ == "__main__":
    main()
