"""One GRPO step, ours vs TRL's GRPOTrainer, on TRL's own CPU workload, measured in one run. ONE JSON line.

The workload: the tiny model (random Qwen3, byte-level BPE), 4 prompts x 4 completions of up to 32
tokens at temperature 1, LoRA r=16 (alpha 32) on all linear layers, reward = characters / 100.
- TRL: `trl.GRPOTrainer` (1.16) in a venv of its own (`bench/_trl_grpo_step.py`): generation with
  `model.generate`, reward, forward/backward, AdamW.
- ours: `agl_bridge.train.grpo.GRPOTrainer` driving an unmodified agent function (the OpenAI client
  through the in-process proxy, recorded with exact ids), then convert, forward/backward, optimizer
  step and the live weight sync to the sampler.
Both run in fresh processes, one after the other, with the same torch threads; each reports the
median wall time of its steps after the first (warm-up). `ratio` = ours / TRL (the issue's bound:
<= 1.5).

TRL's venv (torch stays the CPU build 2.13.0):

    P=~/.cache/agl_bridge/peers; python3.11 -m venv $P/trl && $P/trl/bin/pip install torch==2.13.0
    echo torch==2.13.0 > $P/trl-constraints.txt && $P/trl/bin/pip install trl==1.16.0 peft -c $P/trl-constraints.txt

    .venv/bin/python bench/grpo_vs_trl.py [--steps 8] [--threads N] [--trl-python PATH] [--sampler-process]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
PROMPTS, GROUP, TOKENS = 4, 4, 32
DEFAULT_TRL_PYTHON = Path.home() / ".cache" / "agl_bridge" / "peers" / "trl" / "bin" / "python"


def characters_agent(task: str, endpoint: Any) -> float:
    """The agent: one chat call about the task; the reward is the reply's characters / 100."""
    reply = endpoint.openai_client().chat.completions.create(
        model=endpoint.model,
        messages=[{"role": "user", "content": f"Write something about {task}."}],
        max_tokens=TOKENS,
        temperature=1.0,
    )
    return len(reply.choices[0].message.content or "") / 100


def run_ours(steps: int, sampler_process: bool | None = None) -> dict[str, Any]:
    """Our GRPO loop for `steps` steps; the per-step wall times and their split."""
    from agl_bridge.train.config import GRPOConfig
    from agl_bridge.train.grpo import GRPOTrainer
    from agl_bridge.train.run_log import read_metrics

    with tempfile.TemporaryDirectory(prefix="agl-bench-grpo-") as run_dir:
        config = GRPOConfig(
            model="tiny",
            run_dir=run_dir,
            steps=steps,
            batch_size=PROMPTS,
            group_size=GROUP,
            learning_rate=1e-4,
            lora_rank=16,
            lora_alpha=32.0,
            default_max_tokens=TOKENS,
            eval_every=10**6,
            checkpoint_every=10**6,
            tensorboard=False,
            sampler_process=sampler_process,
        )
        GRPOTrainer(config, agent=characters_agent, tasks=[f"topic {i}" for i in range(64)]).run()
        records = [r for r in read_metrics(run_dir) if r.get("phase") == "train"]
    return {
        "step_s": [r["time_step_s"] for r in records],
        "sample_s": [r["time_sample_s"] for r in records],
        "forward_backward_s": [r["time_forward_backward_s"] for r in records],
    }


def _child(args: list[str], python: str, threads: int | None) -> dict[str, Any]:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    done = subprocess.run(
        [python, *args], capture_output=True, text=True, env=env, timeout=3600, cwd=tempfile.gettempdir()
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _after_warmup(values: list[float]) -> float:
    return round(statistics.median(values[1:] or values), 4)


def main() -> None:
    """Run TRL then ours, print one JSON line (or, with --ours, run ours and print its times)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="torch threads of both (default: torch's)")
    parser.add_argument("--trl-python", default=str(DEFAULT_TRL_PYTHON), help="the Python of TRL's venv")
    parser.add_argument(
        "--sampler-process", action="store_true", help="ours: the hf sampler in a child process (sampler_process)"
    )
    parser.add_argument("--ours", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ours:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        ours = run_ours(args.steps, sampler_process=True if args.sampler_process else None)
        print(json.dumps({**ours, "torch_threads": torch.get_num_threads()}))
        return
    from agl_bridge.models.loading import resolve_model_path

    started = time.perf_counter()
    model = str(resolve_model_path("tiny"))
    ours_args = ["--threads", str(args.threads)] if args.threads else []
    ours_args += ["--sampler-process"] if args.sampler_process else []
    trl = _child(
        [str(BENCH_DIR / "_trl_grpo_step.py"), "--model", model, "--steps", str(args.steps)],
        args.trl_python,
        args.threads,
    )
    ours = _child(
        [str(Path(__file__).resolve()), "--ours", "--steps", str(args.steps), *ours_args], sys.executable, args.threads
    )
    trl_step, our_step = _after_warmup(trl["step_s"]), _after_warmup(ours["step_s"])
    print(
        json.dumps(
            {
                "bench": "grpo_vs_trl",
                "workload": {
                    "prompts": PROMPTS,
                    "completions_per_prompt": GROUP,
                    "max_tokens": TOKENS,
                    "lora_rank": 16,
                },
                "loadavg": os.getloadavg()[0],
                "torch_threads": {"trl": trl["torch_threads"], "ours": ours["torch_threads"]},
                "ours_sampler": "child process" if args.sampler_process else "in the trainer's process",
                "trl_step_s": trl_step,
                "ours_step_s": our_step,
                "ours_sample_s": _after_warmup(ours["sample_s"]),
                "ours_forward_backward_s": _after_warmup(ours["forward_backward_s"]),
                "ratio": round(our_step / trl_step, 2),
                "bound_ratio": 1.5,
                "trl_steps_s": [round(s, 3) for s in trl["step_s"]],
                "ours_steps_s": ours["step_s"],
                "elapsed_s": round(time.perf_counter() - started, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
