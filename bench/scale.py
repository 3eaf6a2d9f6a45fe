"""Scaling out on one machine: several proxies on one PostgreSQL store. Prints ONE JSON line per part.

--part exactness (the issue's turn-k+1 check): two proxy processes (`agl_bridge.testing.serve`,
each with the tiny model on its own HF sampler, same weights) on one PostgreSQL store; 200
conversations of 3 turns, turn t of conversation c served by proxy (c + t) % 2, so every later
turn lands on the proxy that did NOT sample the turn before. Sampling at temperature 1 makes
responses whose text re-tokenizes differently, so without the token cache recovered from the store
the prompts would not extend. Reported: turn pairs whose prompt extends the previous prompt +
sampled ids exactly, out of all (target: 100%).

The PostgreSQL server is a throwaway one (`agl_bridge.testing.postgres`) unless --store URL names
a database (it must be empty or an agl_bridge store).

    .venv/bin/python bench/scale.py [--part exactness] [--conversations 200] [--turns 3] [--store URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx

from agl_bridge.models.tiny import build_tiny_model
from agl_bridge.store import PostgresStore
from agl_bridge.testing.postgres import start_postgres
from agl_bridge.testing.proxy_process import ProxyProcess, start_proxy

CONCURRENT_CONVERSATIONS = 16


async def _converse(client: httpx.AsyncClient, proxies: list[ProxyProcess], index: int, turns: int) -> str:
    """One conversation, its turns alternating between the proxies; returns its rollout id."""
    rollout_id = f"scale-{index:04d}"
    messages: list[dict[str, str]] = [{"role": "user", "content": f"Conversation {index}: say something."}]
    for turn in range(turns):
        proxy = proxies[(index + turn) % len(proxies)]
        answer = await client.post(
            f"{proxy.rollout_url(rollout_id, '0')}/chat/completions",
            json={
                "model": "tiny",
                "messages": messages,
                "max_tokens": 16,
                "temperature": 1.0,
                "seed": index * 7 + turn,
            },
            headers={"Authorization": f"Bearer {proxy.api_key}"},
        )
        if answer.status_code != 200:
            raise RuntimeError(f"{rollout_id} turn {turn}: {answer.status_code} {answer.text}")
        reply = answer.json()["choices"][0]["message"]["content"] or ""
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"And turn {turn + 2}?"}]
    return rollout_id


async def _exactness(dsn: str, proxies: list[ProxyProcess], conversations: int, turns: int) -> dict[str, object]:
    limit = asyncio.Semaphore(CONCURRENT_CONVERSATIONS)

    async def one(client: httpx.AsyncClient, index: int) -> str:
        async with limit:
            return await _converse(client, proxies, index, turns)

    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=120) as client:
        rollout_ids = await asyncio.gather(*(one(client, i) for i in range(conversations)))
    elapsed = time.perf_counter() - started
    exact = pairs = breaks = 0
    async with PostgresStore(dsn) as store:
        for rollout_id in rollout_ids:
            calls = [call async for call in store.iter_llm_calls(rollout_id, "0")]
            assert len(calls) == turns, f"{rollout_id}: {len(calls)} calls stored, {turns} served"
            breaks += sum(len(call.prefix_breaks) for call in calls)
            for before, after in zip(calls, calls[1:], strict=False):
                expected = before.prompt_token_ids + before.response_token_ids
                pairs += 1
                exact += after.prompt_token_ids[: len(expected)] == expected
    return {
        "bench": "scale_exactness",
        "proxies": len(proxies),
        "store": "postgresql",
        "conversations": conversations,
        "turns": turns,
        "turn_pairs": pairs,
        "exact": exact,
        "exact_pct": round(100 * exact / max(1, pairs), 2),
        "prefix_breaks": breaks,
        "elapsed_s": round(elapsed, 1),
    }


def main() -> None:
    """Parse arguments, run the asked parts, print one JSON line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["exactness"], default="exactness")
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--store", default=None, help="a postgresql:// URL (default: a throwaway server)")
    args = parser.parse_args()
    server = None if args.store else start_postgres()
    dsn = args.store or server.dsn()  # type: ignore[union-attr]
    proxies: list[ProxyProcess] = []
    try:
        with tempfile.TemporaryDirectory(prefix="agl-scale-bench-") as folder:
            model_dir = build_tiny_model(Path(folder) / "tiny")
            proxies = [start_proxy(dsn, model_dir, sampler="tiny", log_dir=Path(folder)) for _ in range(2)]
            result = asyncio.run(_exactness(dsn, proxies, args.conversations, args.turns))
    finally:
        for proxy in proxies:
            proxy.stop()
        if server is not None:
            server.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
