"""The load run shared by the CI load test and `bench/reliability_load.py`.

N concurrent rollouts, each a K-turn conversation through the proxy (the real `Runner`, each
rollout on its own `/rollout/{r}/attempt/{a}/v1` base URL). Every user message carries its
rollout's id, so after the run the store is checked call by call: a call missing from its rollout
is lost (a call answered 200 but not in the store), a call whose messages name another rollout is
misattributed, and each attempt's sequence numbers must be unique and increasing.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agl_bridge.runner import Runner, RunnerConfig
from agl_bridge.store import SQLiteStore
from agl_bridge.types import RolloutStatus


@dataclass
class LoadReport:
    """What one load run did and what the store holds afterwards."""

    rollouts: int
    calls_per_rollout: int
    calls_expected: int = 0
    calls_stored: int = 0
    lost: int = 0
    misattributed: int = 0
    out_of_order: int = 0
    rollouts_failed: int = 0
    http_errors: int = 0
    errors: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    wall_s: float = 0.0

    @property
    def p50_ms(self) -> float:
        """Median call latency as the agent saw it."""
        return statistics.median(self.latencies_ms) if self.latencies_ms else float("nan")

    @property
    def p99_ms(self) -> float:
        """99th-percentile call latency (nearest rank)."""
        ordered = sorted(self.latencies_ms)
        return ordered[max(0, -(-len(ordered) * 99 // 100) - 1)] if ordered else float("nan")

    def summary(self) -> dict[str, Any]:
        """The report as plain numbers."""
        return {
            "rollouts": self.rollouts,
            "calls_per_rollout": self.calls_per_rollout,
            "calls_expected": self.calls_expected,
            "calls_stored": self.calls_stored,
            "lost": self.lost,
            "misattributed": self.misattributed,
            "out_of_order": self.out_of_order,
            "rollouts_failed": self.rollouts_failed,
            "http_errors": self.http_errors,
            "p50_ms": round(self.p50_ms, 2),
            "p99_ms": round(self.p99_ms, 2),
            "wall_s": round(self.wall_s, 2),
            "calls_per_s": round(self.calls_expected / self.wall_s, 1) if self.wall_s else None,
            "first_errors": sorted(set(self.errors))[:5],
        }


async def run_load(
    server_url: str,
    api_key: str,
    store_path: str | Path,
    *,
    rollouts: int,
    calls: int,
    model: str = "tiny",
    max_tokens: int = 2,
    timeout_s: float = 600.0,
) -> LoadReport:
    """Run `rollouts` concurrent rollouts of `calls` turns each and check the store; see the module doc."""
    report = LoadReport(rollouts, calls, calls_expected=rollouts * calls)
    limits = httpx.Limits(max_connections=rollouts, max_keepalive_connections=rollouts)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client, SQLiteStore(store_path) as store:
        acknowledged: dict[str, int] = {}  # calls answered 200, per rollout: each must be in the store

        async def agent(task: Any, endpoint: Any) -> float:
            messages: list[dict[str, Any]] = []
            headers = {"Authorization": f"Bearer {endpoint.api_key}"}
            for turn in range(calls):
                messages.append({"role": "user", "content": f"[{endpoint.rollout_id}] turn {turn}"})
                started = time.perf_counter()
                response = await client.post(
                    f"{endpoint.base_url}/chat/completions",
                    headers=headers,
                    json={"model": endpoint.model, "messages": messages, "max_tokens": max_tokens},
                )
                report.latencies_ms.append((time.perf_counter() - started) * 1e3)
                if response.status_code != 200:
                    report.http_errors += 1
                    response.raise_for_status()
                acknowledged[endpoint.rollout_id] = acknowledged.get(endpoint.rollout_id, 0) + 1
                messages.append(response.json()["choices"][0]["message"])
            return 1.0

        runner = Runner(
            agent,
            server_url=server_url,
            api_key=api_key,
            model=model,
            store=store,
            config=RunnerConfig(concurrency=rollouts, timeout_s=timeout_s),
        )
        started = time.perf_counter()
        try:
            outcomes = await runner.run(range(rollouts))
        finally:
            runner.close()
        report.wall_s = time.perf_counter() - started
        for outcome in outcomes:
            if outcome.status is not RolloutStatus.SUCCEEDED:
                report.rollouts_failed += 1
                report.errors.append(f"{outcome.status.value}: {(outcome.error or '')[:200]}")
            stored = [c async for c in store.iter_llm_calls(outcome.rollout_id)]
            report.calls_stored += len(stored)
            report.lost += max(0, acknowledged.get(outcome.rollout_id, 0) - len(stored))
            marker = f"[{outcome.rollout_id}]"
            report.misattributed += sum(
                1
                for c in stored
                if not any(marker in str(m.get("content")) for m in c.messages if m.get("role") == "user")
                or any(
                    "[" in str(m.get("content")) and marker not in str(m.get("content"))
                    for m in c.messages
                    if m.get("role") == "user"
                )
            )
            sequences = [-1 if c.sequence is None else c.sequence for c in stored]  # stored calls always have one
            report.out_of_order += sequences != sorted(set(sequences))
            # The k-th call (in store order) must be the one that sent k+1 user turns.
            report.out_of_order += sum(
                1 for k, c in enumerate(stored) if sum(m.get("role") == "user" for m in c.messages) != k + 1
            )
    return report
