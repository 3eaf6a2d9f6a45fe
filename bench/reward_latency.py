"""In-process reward latency while the proxy's event loop is busy: prints ONE JSON line.

The store is opened on a loop in a thread of its own, as the proxy's is. That loop is kept busy the
way a proxy serving many agents is (a backlog of callbacks of `--busy-ms` CPU each, `--backlog`
of them ready at any time), while `--agents` plain threads each emit `--rewards` rewards with the
blocking `emit_reward` (the in-process `StoreSink`, as agents run by the trainer do). Reports the
p50/p99/max seconds from `emit_reward` to its commit, and the loop's own lag (how long a callback
waits for its turn), which a reward that went through the loop would wait for at least once.

    .venv/bin/python bench/reward_latency.py [--agents 16] [--rewards 20] [--busy-ms 5] [--backlog 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agl_bridge.store import SQLiteStore
from agl_bridge.tracing import StoreSink, emit_reward, set_reward_sink


def _burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main() -> None:
    """Run the load and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--rewards", type=int, default=20)
    parser.add_argument("--busy-ms", type=float, default=5.0)
    parser.add_argument("--backlog", type=int, default=20)
    args = parser.parse_args()
    ready, done = threading.Event(), threading.Event()
    box: dict[str, object] = {}
    lags: list[float] = []

    def serve(path: Path) -> None:
        async def main_loop() -> None:
            loop = asyncio.get_running_loop()

            def request(queued_at: float) -> None:  # one "request" of the busy proxy: it queues the next
                lags.append(time.perf_counter() - queued_at)
                _burn(args.busy_ms / 1000)
                if not done.is_set():
                    loop.call_soon(request, time.perf_counter())

            async with SQLiteStore(path) as store:
                box["store"], box["loop"] = store, loop
                for _ in range(args.backlog):
                    loop.call_soon(request, time.perf_counter())
                ready.set()
                while not done.is_set():
                    await asyncio.sleep(0.05)

        asyncio.run(main_loop())

    with tempfile.TemporaryDirectory() as folder:
        server = threading.Thread(target=serve, args=(Path(folder) / "store.sqlite",))
        server.start()
        ready.wait(30)
        set_reward_sink(StoreSink(box["store"], box["loop"]))  # type: ignore[arg-type]
        latencies: list[float] = []

        def agent(index: int) -> None:
            for number in range(args.rewards):
                started = time.perf_counter()
                emit_reward(float(number), rollout_id=f"ro-{index}", attempt_id="at-1")
                latencies.append(time.perf_counter() - started)

        agents = [threading.Thread(target=agent, args=(i,)) for i in range(args.agents)]
        began = time.perf_counter()
        for thread in agents:
            thread.start()
        for thread in agents:
            thread.join()
        wall = time.perf_counter() - began
        done.set()
        server.join(30)
        set_reward_sink(None)
    latencies.sort()
    lags.sort()

    def q(values: list[float], share: float) -> float:
        return round(values[min(len(values) - 1, int(share * len(values)))], 4)

    print(
        json.dumps(
            {
                "bench": "reward_latency",
                "agents": args.agents,
                "rewards": len(latencies),
                "busy_ms": args.busy_ms,
                "backlog": args.backlog,
                "reward_p50_s": q(latencies, 0.5),
                "reward_p99_s": q(latencies, 0.99),
                "reward_max_s": q(latencies, 1.0),
                "reward_mean_s": round(statistics.fmean(latencies), 4),
                "loop_lag_p50_s": q(lags, 0.5),
                "rewards_per_s": round(len(latencies) / wall, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
