"""Reliability fuzz benchmark: ≥10,000 generated requests against a proxy; no 5xx, only errors in each route's shape.

The requests come from the hypothesis strategies in `agl_bridge.testing.fuzz` (chat and
completion bodies with wrong types and values, odd rollout ids, OTLP bodies, unknown routes, raw
bytes, Anthropic Messages and Responses bodies), sent one after another to `ProxyServer` over an
InstantSampler in a subprocess. Every answer is checked: below 500, errors in the route's
protocol's shape (OpenAI's with a word `code`, Anthropic's on `/v1/messages`), streams without
error events. Prints one JSON object (counts by status, every broken promise found, up to 50
listed); exits 1 if any was found or the server stopped answering.

`--per-route N` sends N requests to each route of `agl_bridge.testing.fuzz.ROUTES` instead (Anthropic
Messages, its token count, Responses, stored responses, token completions, chat; half of them streamed
where the route streams) and reports each route's counts.

    .venv/bin/python bench/reliability_fuzz.py [--requests 10000] [--seed 0]
    .venv/bin/python bench/reliability_fuzz.py --per-route 1000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from agl_bridge.testing.fuzz import ROUTES, FuzzRequest, check_answer, requests, route_requests, send
from agl_bridge.testing.proxy_process import start_proxy


def fuzz(
    base_url: str, api_key: str, count: int, random_seed: int, strategy: st.SearchStrategy[FuzzRequest]
) -> dict[str, Any]:
    """Send `count` requests drawn from `strategy`; statuses, problems and timing."""
    statuses: Counter[int] = Counter()
    problems: list[str] = []
    with httpx.Client(base_url=base_url, timeout=120) as client:

        @seed(random_seed)
        @settings(max_examples=count, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(request=strategy)
        def one(request: FuzzRequest) -> None:
            try:
                response = send(client, request, api_key)
            except httpx.HTTPError as error:
                problems.append(f"{request.method} {request.path}: no answer ({error!r})")
                return
            statuses[response.status_code] += 1
            if sum(statuses.values()) % 1000 == 0:  # partial figures, in case the run is cut short
                print(
                    json.dumps(
                        {"requests": sum(statuses.values()), "by_status": dict(statuses), "problems": len(problems)}
                    ),
                    file=sys.stderr,
                    flush=True,
                )
            problem = check_answer(request, response)
            if problem is not None:
                problems.append(f"{request.method} {request.path} {request.body[:200]!r}: {problem}")

        started = time.monotonic()
        one()
        elapsed = time.monotonic() - started
        alive = client.get("/health/liveliness").status_code == 200
    return {
        "requests": sum(statuses.values()),
        "by_status": dict(sorted(statuses.items())),
        "problems": len(problems),
        "problem_list": problems[:50],
        "server_alive_after": alive,
        "wall_s": round(elapsed, 1),
    }


def main(argv: list[str]) -> int:
    """Run the fuzz benchmark; print one JSON object; 1 if a promise was broken."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-route", type=int, default=0, help="N requests to each route instead of the mix")
    args = parser.parse_args(argv)
    from agl_bridge.models.loading import resolve_model_path

    with tempfile.TemporaryDirectory(prefix="agl-rel-fuzz-") as folder:
        proxy = start_proxy(
            Path(folder) / "store.sqlite", Path(resolve_model_path("tiny")), sampler="instant", tokens=4
        )
        try:
            if args.per_route:
                per_route = {
                    route: fuzz(proxy.base_url, proxy.api_key, args.per_route, args.seed, route_requests(route))
                    for route in ROUTES
                }
                results = list(per_route.values())
                output: dict[str, Any] = {"per_route": per_route}
            else:
                result = fuzz(proxy.base_url, proxy.api_key, args.requests, args.seed, requests())
                results, output = [result], result
        finally:
            proxy.stop()
    print(json.dumps(output))
    return 0 if all(r["problems"] == 0 and r["server_alive_after"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
