"""One huge request must not stall the others: small-request latency and proxy memory while oversized
requests are refused. ONE JSON line.

A proxy over the instant sampler (`agl_bridge.testing.serve`, tiny tokenizer, a 4 MiB body limit)
answers short chat requests from 4 rollouts at once, first idle, then while another process keeps
sending oversized requests: a 10 MB body (413 by its declared length), the same body chunked (413 once
it passes the limit), a 3.5 MB prompt under the limit that cannot fit (refused by its length before
tokenizing) and a 30,000-character prompt that must be tokenized to know (in a worker thread). Reports the
small requests' p50/p99 both ways (the bound: loaded p99 <= 2x idle p99), the refusals, and the
proxy's peak RSS growth (bound: < 150 MiB; one 20 MB request used to grow it by ~1.1 GB).

    .venv/bin/python bench/proxy_oversize.py [--small-requests 400]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from agl_bridge.models.loading import resolve_model_path
from agl_bridge.testing.oversize import LIMIT_BYTES, measure_oversize
from agl_bridge.testing.proxy_process import start_proxy


def main() -> None:
    """Run the measurement and print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small-requests", type=int, default=400, help="small requests per phase (idle, loaded)")
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="agl-bench-oversize-") as directory:
        proxy = start_proxy(
            Path(directory) / "store.sqlite", Path(resolve_model_path("tiny")), max_request_bytes=LIMIT_BYTES
        )
        try:
            report = measure_oversize(proxy, args.small_requests)
        finally:
            proxy.stop()
    figures = report.summary()
    out = {
        "bench": "proxy_oversize",
        "loadavg": os.getloadavg()[0],
        **figures,
        "bound_p99_ratio": 2.0,
        "bound_rss_growth_mib": 150,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
