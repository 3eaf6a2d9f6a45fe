"""Viewer benchmark: prints ONE JSON line.

Builds the converter benchmark's synthetic store (bench/convert.py: `--rollouts` rollouts × `--calls`
multi-turn LLM calls, groups of 8, every fourth rollout with a second named reward, one in 50
failed; 20,000 × 5 = 100,000 calls by default), then serves `agl-bridge view`'s app over it
in-process (Starlette's test client: the whole app — key gate, handlers, SQL, templates — without
the network) and times its pages, each fetched `--repeat` times after one warm-up fetch:

  - rollout: one rollout's page (its timeline), for `--samples` rollouts spread over the store;
  - tokens: the same rollouts' trained view (the group converted, the trainer's advantages);
  - call: one call in full;
  - list pages: all rollouts (first page, a page deep in the list, sorted by return, filtered
    by status, by task text, by a return range), and a group.

Reports the median and the slowest time per page in ms, and whether the rollout page stays under
300 ms. Token text is off (the synthetic ids belong to no tokenizer), so the token view's time
is without decoding.

    .venv/bin/python bench/viewer.py [--rollouts 20000] [--calls 5] [--samples 20] [--repeat 3] [--store PATH]

`--store PATH` keeps the built store there (reused by later runs with the same sizes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from convert import build  # bench/convert.py: the synthetic store
from starlette.testclient import TestClient

from agl_bridge.viewer.app import Viewer, create_app

TARGET_ROLLOUT_MS = 300
KEY = "bench"
SIZES = {"prompt": 64, "response": 32, "observation": 16}


def timed(client: TestClient, url: str, repeat: int) -> list[float]:
    """Milliseconds of `repeat` fetches of `url` (after one warm-up fetch); fails on a non-200 answer."""
    client.get(url)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            raise SystemExit(f"{url} answered {response.status_code}: {response.text[:300]}")
    return times


def summary(times: list[float]) -> dict[str, float]:
    """Median and slowest, in ms."""
    return {"median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1)}


def measure(path: Path, samples: int, repeat: int) -> dict[str, object]:
    """Time the pages of the viewer over the store at `path`."""
    viewer = Viewer(path)
    viewer.settle()  # as `agl-bridge view` does in the background at start
    client = TestClient(create_app(viewer, key=KEY, port=0))
    client.headers["authorization"] = f"Bearer {KEY}"
    try:
        with viewer.store.snapshot() as conn:
            total = conn.execute("SELECT count(*) FROM rollouts").fetchone()[0]
            step = max(1, total // samples)
            every = [row[0] for row in conn.execute("SELECT rollout_id FROM rollouts ORDER BY rowid")]
            picked = every[::step][:samples]
            group = conn.execute("SELECT group_id FROM rollouts WHERE rollout_id = ?", (picked[-1],)).fetchone()[0]
            calls = conn.execute("SELECT count(*) FROM llm_calls").fetchone()[0]
        pages: dict[str, list[float]] = {"rollout": [], "tokens": [], "call": []}
        for rollout_id in picked:
            pages["rollout"] += timed(client, f"/rollouts/{rollout_id}", repeat)
            pages["tokens"] += timed(client, f"/rollouts/{rollout_id}?view=tokens", repeat)
        with viewer.store.snapshot() as conn:
            attempt = conn.execute("SELECT attempt_id FROM attempts WHERE rollout_id = ?", (picked[0],)).fetchone()[0]
        pages["call"] = timed(client, f"/rollouts/{picked[0]}/calls/2?attempt={attempt}", repeat)
        lists = {
            "list_first_page": "/rollouts",
            "list_deep_page": f"/rollouts?page={max(1, total // 50 // 2)}",
            "list_by_return": "/rollouts?sort=return",
            "list_failed": "/rollouts?status=failed",
            "list_text_search": "/rollouts?q=task%20123",
            "list_return_range": "/rollouts?min=0.5&max=2",
            "group": f"/groups/{group}",
            "runs": "/",
        }
        for name, url in lists.items():
            pages[name] = timed(client, url, repeat)
    finally:
        viewer.close()
    result = {name: summary(times) for name, times in pages.items()}
    return {"calls": calls, "rollouts": total, "pages": result, "rollout_page_max_ms": result["rollout"]["max_ms"]}


def main() -> None:
    """Parse arguments, build the store (unless kept), time the pages, print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=20_000)
    parser.add_argument("--calls", type=int, default=5, help="LLM calls per rollout")
    parser.add_argument("--samples", type=int, default=20, help="rollouts whose pages are timed")
    parser.add_argument("--repeat", type=int, default=3, help="timed fetches per page")
    parser.add_argument("--store", type=Path, default=None, help="keep/reuse the built store here")
    args = parser.parse_args()
    sizes = [args.rollouts, args.calls, *SIZES.values()]
    with tempfile.TemporaryDirectory(prefix="agl-bench-viewer-") as scratch:
        path = args.store or Path(scratch) / "viewer.db"
        stamp = path.with_suffix(path.suffix + ".sizes")
        build_s = 0.0
        if not (path.exists() and stamp.exists() and stamp.read_text() == json.dumps(sizes)):
            path.unlink(missing_ok=True)
            started = time.perf_counter()
            asyncio.run(build(path, args.rollouts, args.calls, *SIZES.values()))
            build_s = time.perf_counter() - started
            stamp.write_text(json.dumps(sizes))
        measured = measure(path, args.samples, args.repeat)
    print(
        json.dumps(
            {
                "bench": "viewer",
                **measured,
                "build_seconds": round(build_s, 1),
                "target_rollout_ms": TARGET_ROLLOUT_MS,
                "meets_target": measured["rollout_page_max_ms"] < TARGET_ROLLOUT_MS,
            }
        )
    )


if __name__ == "__main__":
    main()
