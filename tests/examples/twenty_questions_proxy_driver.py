"""Driver for test_twenty_questions_proxy_config: one game through a proxy with a user LiteLLM config.

    python twenty_questions_proxy_driver.py STORE CONFIG   → prints one JSON line

Runs in its own process (LiteLLM's proxy is one per process). The player and the answerer are both
models of the user's LiteLLM config (LiteLLM `mock_response` entries, so nothing leaves the machine),
the answerer reached through the rollout's base_url. The test sets `TWENTYQ_ANSWERER_MODEL=answerer`,
`TWENTYQ_ANSWERER_VIA_PROXY=1` and `TWENTYQ_MAX_TURNS=2` in this process's environment; nothing here
changes `os.environ`, so importing this module never reconfigures the games of the importing process.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import twenty_questions_helpers  # noqa: F401  (puts the example on the import path)
from twenty_q.agent import play_game

from agl_bridge.models.loading import load_causal_lm, load_tokenizer, resolve_model_path
from agl_bridge.proxy.server import ProxyServer
from agl_bridge.runner import Runner, RunnerConfig
from agl_bridge.sampler.hf import HFSampler
from agl_bridge.store.sqlite import SQLiteStore


def main(store_path: str, config_path: str) -> None:
    """Play one game, print its final state and the calls the store recorded for it."""
    path = resolve_model_path("tiny")
    tokenizer = load_tokenizer(path)
    sampler = HFSampler(load_causal_lm(path), tokenizer, seed=0)
    proxy = ProxyServer(
        sampler=sampler, tokenizer=tokenizer, store_path=store_path, port=0, litellm_config_path=config_path
    )
    states: dict[str, Any] = {}

    def agent(task: Any, endpoint: Any) -> None:
        states[endpoint.rollout_id] = play_game(task, endpoint).summary()

    async def run() -> dict[str, Any]:
        async with SQLiteStore(store_path) as store:
            runner = Runner(
                agent,
                server_url=proxy.base_url,
                api_key=proxy.api_key,
                model="scripted-player",
                store=store,
                config=RunnerConfig(timeout_s=120),
            )
            try:
                (outcome,) = await runner.run([{"secret": "penguin", "category": "animals"}])
            finally:
                runner.close()
            calls = [c async for c in store.iter_llm_calls(outcome.rollout_id)]
            return {
                "status": outcome.status.value,
                "error": outcome.error,
                "state": states.get(outcome.rollout_id),
                "calls": [[c.kind, c.model] for c in calls],
            }

    try:
        proxy.start()
        print(json.dumps(asyncio.run(run())))
    finally:
        proxy.stop()
        sampler.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
