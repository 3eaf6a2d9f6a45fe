"""A real third-party agent, mini-swe-agent (PyPI), driven by a small harness outside our runner.

The harness never imports agl_bridge: it names the task (`POST .../start`), runs the unmodified
`mini` command with its model pointed at the rollout's base URL (`openai/<model>` through
mini-swe-agent's own LiteLLM), checks the work, reports the reward (`POST .../reward`) and finishes
the rollout (`POST .../finish`). mini-swe-agent lives in a virtual environment of its own (its
dependencies, LiteLLM's newest included, do not match ours), created on first use under the cache
directory (`--cache`, default `.cache/agents`), so later runs start at once.

    agl-bridge serve --model tiny --store runs/mini.sqlite --port 4000 --api-key KEY    # terminal 1
    python examples/external_harness/mini_swe_agent.py --base-url http://127.0.0.1:4000 --api-key KEY

The task is trivial ("create hello.txt containing hello"): the reward is 1 if the file is there
with that text, else 0. The tiny random model will not manage it; the point is the plumbing: its
calls land in the store under this harness's rollout and task ids and convert into trajectories.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import httpx

MINI_SWE_AGENT = "mini-swe-agent==2.4.6"
TASK = "Create a file named hello.txt in the current directory containing the word hello."


def ensure_installed(cache: Path) -> Path:
    """The `mini` command of a private venv under `cache`, installing mini-swe-agent there first if needed."""
    venv = cache / "mini-swe-agent"
    mini = venv / "bin" / "mini"
    marker = venv / f".installed-{MINI_SWE_AGENT}"
    if marker.is_file() and mini.is_file():
        return mini
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", MINI_SWE_AGENT], check=True)
    marker.touch()
    return mini


def agent_env(config_dir: str) -> dict[str, str]:
    """mini-swe-agent's environment: no first-run questions, no outside calls, no cost lookups."""
    return {
        **os.environ,
        "MSWEA_CONFIGURED": "true",
        "MSWEA_SILENT_STARTUP": "1",
        "MSWEA_GLOBAL_CONFIG_DIR": config_dir,
        "MSWEA_COST_TRACKING": "ignore_errors",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "HF_HUB_OFFLINE": "1",
    }


def run_rollout(mini: Path, base_url: str, api_key: str, model: str, task_id: str, steps: int) -> dict[str, object]:
    """One rollout: start, the agent, the reward, finish. Returns the finish answer."""
    rollout_id = f"mini-{uuid.uuid4().hex[:12]}"
    prefix = f"{base_url.rstrip('/')}/rollout/{rollout_id}/attempt/0"
    http = httpx.Client(headers={"Authorization": f"Bearer {api_key}"}, timeout=120)
    started = http.post(f"{prefix}/start", json={"task_id": task_id, "metadata": {"task": TASK}})
    started.raise_for_status()
    with tempfile.TemporaryDirectory(prefix="mini-work-") as work, tempfile.TemporaryDirectory() as config_dir:
        command = [
            str(mini), "--yolo", "--exit-immediately", "--task", TASK, "--model", f"openai/{model}",
            "--config", "mini.yaml",
            "--config", f"model.model_kwargs.api_base={prefix}/v1",
            "--config", f"model.model_kwargs.api_key={api_key}",
            "--config", "model.model_kwargs.max_tokens=48",
            "--config", f"agent.step_limit={steps}",
            "--config", "agent.cost_limit=0",
            "--output", str(Path(config_dir) / "trajectory.json"),
        ]  # fmt: skip
        done = subprocess.run(
            command, cwd=work, env=agent_env(config_dir), capture_output=True, text=True, timeout=600, check=False
        )
        hello = Path(work) / "hello.txt"
        reward = 1.0 if hello.is_file() and "hello" in hello.read_text(errors="replace") else 0.0
    http.post(f"{prefix}/reward", json={"value": reward, "name": "hello_file"}).raise_for_status()
    if done.returncode == 0:
        finished = http.post(f"{prefix}/finish", json={"status": "succeeded"})
    else:
        error = f"mini exited with {done.returncode}: {(done.stderr or done.stdout)[-2000:]}"
        finished = http.post(f"{prefix}/finish", json={"status": "failed", "error": error})
    finished.raise_for_status()
    answer: dict[str, object] = finished.json() | {"reward": reward, "agent_exit_code": done.returncode}
    return answer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="the proxy, e.g. http://127.0.0.1:4000")
    parser.add_argument("--api-key", required=True, help="the key agl-bridge serve printed")
    parser.add_argument("--model", default="tiny", help="the served model name")
    parser.add_argument("--task-id", default="hello-file", help="the task these rollouts belong to (their group)")
    parser.add_argument("--rollouts", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2, help="mini-swe-agent's step limit (model calls)")
    parser.add_argument("--cache", type=Path, default=Path(".cache/agents"), help="where mini-swe-agent is installed")
    args = parser.parse_args(argv)
    mini = ensure_installed(args.cache.resolve())
    for _ in range(args.rollouts):
        print(json.dumps(run_rollout(mini, args.base_url, args.api_key, args.model, args.task_id, args.steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
