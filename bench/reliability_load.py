"""Reliability load benchmark: load held with nothing lost or mixed up; store size and proxy RSS bounded.

(a) `instant_256x10`: 256 concurrent rollouts × 10 turns through `ProxyServer` over an
    InstantSampler (the pure overhead: gateway, LiteLLM, chat template, durable recording).
(b) `tiny_256x10`: the same with the tiny model on the HF sampler.
(c) `soak`: 100,000 calls (rounds of 250 rollouts × 10 turns) through one InstantSampler proxy and
    one store, tracking the store's size per call (database + WAL) and the proxy's RSS per round.

Each run checks the store call by call (`agl_bridge.testing.load`): lost calls,
calls attributed to the wrong rollout, out-of-order sequences; and reports the agent-side p50/p99
latency. Proxies run as subprocesses (`agl_bridge.testing.serve`) on 127.0.0.1.
Prints one JSON object; exits 1 if anything was lost, misattributed or out of order, or if the
proxy's RSS grew more than 25% over the second half of the soak (a leak).

    .venv/bin/python bench/reliability_load.py [--rollouts 256] [--calls 10] [--soak-calls 100000]
                                               [--skip-instant] [--skip-tiny] [--skip-soak] [--timeout-s 600]
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
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agl_bridge.testing.checks import integrity
from agl_bridge.testing.load import run_load
from agl_bridge.testing.proxy_process import ProxyProcess, start_proxy

SOAK_ROUND = (250, 10)


def rss_mib(pid: int) -> float | None:
    """Resident set size of a process in MiB (Linux)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def store_bytes(path: Path) -> int:
    """Bytes of the store on disk: the database and its WAL."""
    return sum(os.path.getsize(p) for p in (path, Path(f"{path}-wal")) if p.exists())


TIMEOUT_S = 600.0  # per rollout attempt (RunnerConfig.timeout_s); --timeout-s


def _run(proxy: ProxyProcess, rollouts: int, calls: int, max_tokens: int) -> dict[str, Any]:
    report = asyncio.run(
        run_load(
            proxy.base_url,
            proxy.api_key,
            proxy.store,
            rollouts=rollouts,
            calls=calls,
            max_tokens=max_tokens,
            timeout_s=TIMEOUT_S,
        )
    )
    return {**report.summary(), "proxy_rss_mib": rss_mib(proxy.process.pid)}


def load_run(kind: str, model_dir: str, rollouts: int, calls: int, max_tokens: int) -> dict[str, Any]:
    """One rollouts × calls run on a fresh proxy and store."""
    with tempfile.TemporaryDirectory(prefix="agl-rel-load-") as folder:
        store = Path(folder) / "store.sqlite"
        proxy = start_proxy(store, Path(model_dir), sampler=kind, tokens=8)
        try:
            result = _run(proxy, rollouts, calls, max_tokens)
        finally:
            proxy.stop()
        result["integrity"] = integrity(store)
        result["store_bytes_per_call"] = round(store_bytes(store) / max(1, result["calls_stored"]))
    return result


def soak(model_dir: str, total_calls: int) -> dict[str, Any]:
    """`total_calls` calls in rounds through one instant proxy; size and RSS per round."""
    rollouts, calls = SOAK_ROUND
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="agl-rel-soak-") as folder:
        store = Path(folder) / "store.sqlite"
        proxy = start_proxy(store, Path(model_dir), sampler="instant", tokens=8)
        try:
            rss_start = rss_mib(proxy.process.pid)
            done = 0
            while done < total_calls:
                result = _run(proxy, rollouts, calls, 8)
                done += result["calls_expected"]
                rounds.append(
                    {
                        "calls": done,
                        "rss_mib": result["proxy_rss_mib"],
                        "store_bytes": store_bytes(store),
                        **{
                            k: result[k]
                            for k in (
                                "lost",
                                "misattributed",
                                "out_of_order",
                                "rollouts_failed",
                                "p50_ms",
                                "p99_ms",
                                "calls_per_s",
                            )
                        },
                    }
                )
                print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
        finally:
            proxy.stop()
        intact = integrity(store)
    rss = [r["rss_mib"] for r in rounds if r["rss_mib"] is not None]
    half = len(rounds) // 2
    first_half_calls = rounds[half - 1]["calls"] if half else 0
    per_call_first = rounds[half - 1]["store_bytes"] / first_half_calls if half else None
    per_call_second = (
        ((rounds[-1]["store_bytes"] - rounds[half - 1]["store_bytes"]) / (rounds[-1]["calls"] - first_half_calls))
        if half
        else None
    )
    return {
        "calls": rounds[-1]["calls"] if rounds else 0,
        "lost": sum(r["lost"] for r in rounds),
        "misattributed": sum(r["misattributed"] for r in rounds),
        "out_of_order": sum(r["out_of_order"] for r in rounds),
        "rollouts_failed": sum(r["rollouts_failed"] for r in rounds),
        "p50_ms_median_of_rounds": sorted(r["p50_ms"] for r in rounds)[len(rounds) // 2] if rounds else None,
        "p99_ms_max_of_rounds": max((r["p99_ms"] for r in rounds), default=None),
        "rss_mib_start": rss_start,
        "rss_mib_peak": max(rss, default=None),
        "rss_mib_end": rss[-1] if rss else None,
        "rss_mib_at_half": rounds[half - 1]["rss_mib"] if half else None,
        "store_bytes_end": rounds[-1]["store_bytes"] if rounds else 0,
        "store_bytes_per_call_first_half": round(per_call_first) if per_call_first else None,
        "store_bytes_per_call_second_half": round(per_call_second) if per_call_second else None,
        "integrity": intact,
    }


def main(argv: list[str]) -> int:
    """Run the benchmark; print one JSON object; 1 if a promise was broken."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=256)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--soak-calls", type=int, default=100_000)
    parser.add_argument("--skip-tiny", action="store_true")
    parser.add_argument("--skip-soak", action="store_true")
    parser.add_argument("--skip-instant", action="store_true")
    parser.add_argument(
        "--timeout-s", type=float, default=600.0, help="per rollout attempt; raise it on a loaded machine"
    )
    args = parser.parse_args(argv)
    global TIMEOUT_S
    TIMEOUT_S = args.timeout_s
    from agl_bridge.models.loading import resolve_model_path

    model_dir = resolve_model_path("tiny")
    started = time.monotonic()
    out: dict[str, Any] = {"cpus": os.cpu_count()}
    if not args.skip_instant:
        out["instant_256x10"] = load_run("instant", model_dir, args.rollouts, args.calls, 8)
    if not args.skip_tiny:
        out["tiny_256x10"] = load_run("tiny", model_dir, args.rollouts, args.calls, 4)
    if not args.skip_soak:
        out["soak"] = soak(model_dir, args.soak_calls)
    out["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(out))
    runs = [v for k, v in out.items() if isinstance(v, dict)]
    broken = any(r["lost"] or r["misattributed"] or r["out_of_order"] or r["integrity"] != "ok" for r in runs)
    if (
        "soak" in out
        and out["soak"]["rss_mib_at_half"]
        and out["soak"]["rss_mib_end"] > 1.25 * out["soak"]["rss_mib_at_half"]
    ):
        broken = True
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
