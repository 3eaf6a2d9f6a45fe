"""Reliability fuzz benchmark: ≥10,000 generated requests against a proxy; no 5xx, only OpenAI errors.

The requests come from the hypothesis strategies in `agl_bridge.testing.fuzz` (chat and
completion bodies with wrong types and values, odd rollout ids, OTLP bodies, unknown routes, raw
bytes), sent one after another to `ProxyServer` over an InstantSampler in a subprocess. Every
answer is checked: below 500, errors in OpenAI's shape with a word `code`, streams without error
events. Prints one JSON object (counts by status, every broken promise found, up to 50 listed);
exits 1 if any was found or the server stopped answering.

    .venv/bin/python bench/reliability_fuzz.py [--requests 10000] [--seed 0]
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

from agl_bridge.testing.fuzz import FuzzRequest, check_answer, requests, send
from agl_bridge.testing.proxy_process import start_proxy


def fuzz(base_url: str, api_key: str, count: int, random_seed: int) -> dict[str, Any]:
    """Send `count` generated requests; statuses, problems and timing."""
    statuses: Counter[int] = Counter()
    problems: list[str] = []
    with httpx.Client(base_url=base_url, timeout=120) as client:

        @seed(random_seed)
        @settings(max_examples=count, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(request=requests())
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
    args = parser.parse_args(argv)
    from agl_bridge.models.loading import resolve_model_path

    with tempfile.TemporaryDirectory(prefix="agl-rel-fuzz-") as folder:
        proxy = start_proxy(
            Path(folder) / "store.sqlite", Path(resolve_model_path("tiny")), sampler="instant", tokens=4
        )
        try:
            result = fuzz(proxy.base_url, proxy.api_key, args.requests, args.seed)
        finally:
            proxy.stop()
    print(json.dumps(result))
    return 0 if result["problems"] == 0 and result["server_alive_after"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
