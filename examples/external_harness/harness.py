"""The hello agent as an outside harness: its own process, its own loop, plain `openai` and HTTP only.

It never imports agl_bridge. For each rollout it names the task (`POST .../start`), lets the
agent talk to the model through the per-rollout base URL with the `openai` client, reports the
reward (`POST .../reward`) and finishes the rollout (`POST .../finish`). Every round it runs
`--batch-size` training numbers × `--group-size` rollouts (one GRPO group per number), and every
`--eval-every` rounds the held-out numbers `--eval-group-size` times each, marked `eval` (never
trained). The training numbers are the demo's RL half, short numbers weighted as there
(examples/hello_qwen/agent.py).

    python examples/external_harness/harness.py --endpoint-file runs/follow/endpoint.json
    python examples/external_harness/harness.py --base-url http://127.0.0.1:4000 --api-key KEY

It runs `--rounds` rounds (0: until the server goes away, e.g. the follow trainer finished).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hello_qwen"))

# The game's rules and the demo's split of the numbers (agent.py imports agl_bridge only inside the agent).
from agent import prompt_for, reward_for, split_numbers, split_warm_start_and_rl, with_short_numbers_weighted


class Harness:
    """Runs rollouts against a proxy: one thread per rollout, up to `concurrency` at once."""

    def __init__(self, base_url: str, api_key: str, *, model: str, max_tokens: int, concurrency: int) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.max_tokens = max_tokens
        self.http = httpx.Client(headers={"Authorization": f"Bearer {api_key}"}, timeout=120)
        self.api_key = api_key
        self.pool = ThreadPoolExecutor(max_workers=concurrency)
        self.run_id = uuid.uuid4().hex[:8]
        # One OpenAI client (its connection pool and TLS context) for every rollout; each gets its own base URL.
        self.openai = openai.OpenAI(base_url=self.base_url, api_key=api_key, max_retries=0)

    def lifecycle(self, rollout_id: str, route: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST one lifecycle request; raise on anything but 200 (the error names what was wrong)."""
        response = self.http.post(f"{self.base_url}/rollout/{rollout_id}/attempt/0/{route}", json=body)
        if response.status_code != 200:
            raise RuntimeError(f"{route} answered {response.status_code}: {response.text}")
        answer: dict[str, Any] = response.json()
        return answer

    def rollout(self, number: int, rollout_id: str, is_eval: bool) -> float:
        """One rollout of the hello agent on `number`; its reward."""
        task = {"task_id": f"number-{number}", "metadata": {"number": number}, "eval": is_eval}
        self.lifecycle(rollout_id, "start", task)
        try:
            client = self.openai.with_options(base_url=f"{self.base_url}/rollout/{rollout_id}/attempt/0/v1")
            reply = client.chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": prompt_for(number)}],
                max_tokens=self.max_tokens,
            )
            reward = reward_for(reply.choices[0].message.content, number)
            self.lifecycle(rollout_id, "reward", {"value": reward})
        except Exception as error:
            self.lifecycle(rollout_id, "finish", {"status": "failed", "error": f"{type(error).__name__}: {error}"})
            raise
        self.lifecycle(rollout_id, "finish", {"status": "succeeded"})
        return reward

    def batch(self, numbers: list[int], group_size: int, label: str, is_eval: bool = False) -> list[float]:
        """Every number `group_size` times, concurrently; the rewards."""
        jobs = [
            self.pool.submit(self.rollout, number, f"{self.run_id}-{label}-{number}-{k}", is_eval)
            for number in numbers
            for k in range(group_size)
        ]
        return [job.result() for job in jobs]

    def reachable(self) -> bool:
        """Whether the proxy still answers."""
        try:
            return self.http.get(f"{self.base_url}/health/liveliness", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False


def distinct_picks(rng: random.Random, mix: list[int], count: int) -> list[int]:
    """`count` different numbers drawn from `mix` (where a number may repeat, to weigh it): one group each."""
    picked: list[int] = []
    while len(picked) < count:
        if (number := rng.choice(mix)) not in picked:
            picked.append(number)
    return picked


def endpoint_of(args: argparse.Namespace) -> tuple[str, str]:
    """The proxy's base URL and key: from the flags, or the follow trainer's endpoint file once it appears."""
    if args.base_url:
        return args.base_url, args.api_key
    path = Path(args.endpoint_file)
    deadline = time.monotonic() + args.wait_s
    while not path.is_file():
        if time.monotonic() > deadline:
            raise SystemExit(f"{path} did not appear within {args.wait_s:g}s; is the follow trainer running?")
        time.sleep(0.5)
    endpoint = json.loads(path.read_text())
    return endpoint["base_url"], endpoint["api_key"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint-file", default="runs/follow/endpoint.json", help="written by the follow trainer")
    parser.add_argument("--base-url", help="the proxy's URL (instead of --endpoint-file)")
    parser.add_argument("--api-key", default="", help="the proxy's key (with --base-url)")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--rounds", type=int, default=0, help="rounds to run (0: until the server goes away)")
    parser.add_argument("--batch-size", type=int, default=16, help="training numbers per round")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per number (one GRPO group)")
    parser.add_argument("--eval-every", type=int, default=10, help="rounds between held-out evaluations (0: none)")
    parser.add_argument(
        "--eval-group-size", type=int, default=4, help="rollouts per held-out number: 4 halves the noise of 1"
    )
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--wait-s", type=float, default=600.0, help="how long to wait for the endpoint file")
    args = parser.parse_args(argv)

    base_url, api_key = endpoint_of(args)
    harness = Harness(base_url, api_key, model=args.model, max_tokens=args.max_tokens, concurrency=args.concurrency)
    train_numbers, _, held_out = split_numbers()
    training_mix = with_short_numbers_weighted(split_warm_start_and_rl(train_numbers)[1])
    rng = random.Random(args.seed)
    round_number = 0
    try:
        while args.rounds == 0 or round_number < args.rounds:
            if args.eval_every and round_number % args.eval_every == 0:
                rewards = harness.batch(held_out, args.eval_group_size, f"e{round_number}", is_eval=True)
                print(f"round {round_number}: held-out reward {sum(rewards) / len(rewards):+.3f}", flush=True)
            rewards = harness.batch(
                distinct_picks(rng, training_mix, args.batch_size), args.group_size, f"r{round_number}"
            )
            print(f"round {round_number}: training reward {sum(rewards) / len(rewards):+.3f}", flush=True)
            round_number += 1
    except Exception as error:
        if harness.reachable():
            raise
        print(f"the server went away after {round_number} rounds ({type(error).__name__}); done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
