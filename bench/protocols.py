"""Protocol benchmark: what the Responses and Anthropic routes cost over Chat Completions. ONE JSON line.

(a) `added_p50`: the same short request (one user message, the same answer) as a Chat Completion,
    a Responses request and an Anthropic Messages request, non-streamed, to one `ProxyServer` over
    an InstantSampler (`bench/proxy.py --serve traced`: chat template, instant sampler, recording):
    sequential requests on a keep-alive client, the three protocols in alternating blocks so that
    background load hits all alike; `messages_minus_chat_p50_ms` / `responses_minus_chat_p50_ms`
    are what each bridge adds (the issue's bound: <= 1 ms). Server CPU per request too, and
    `*_minus_chat_cpu_ms`, what each bridge adds to it.
(a') `added_streamed`: the same, streamed (`"stream": true`), on the same server: latency to the
    first event carrying generated text, and server CPU per request (the whole stream).
(b) `ttft`: time to the first streamed token (the first event carrying generated text: a chat
    chunk with content, Anthropic's first `content_block_delta`, Responses' first
    `response.output_text.delta`) for the same request streamed, through `ProxyServer` over the
    tiny model's HFSampler (`--serve hf`), alternating blocks again; `*_over_chat` is each
    protocol's median over chat's (the bound: <= 1.2).

    .venv/bin/python bench/protocols.py [--requests 300] [--warmup 30] [--block 30] [--ttft-requests 60]
                                        [--skip-streamed] [--skip-ttft]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from _proxy_servers import latency_summary  # noqa: E402
from proxy import API_KEY, Server  # noqa: E402

PROMPT = "hi"
MAX_TOKENS = 16


def bodies(model: str, stream: bool) -> dict[str, dict[str, Any]]:
    """The same request in each protocol."""
    messages = [{"role": "user", "content": PROMPT}]
    return {
        "chat": {"model": model, "messages": messages, "max_tokens": MAX_TOKENS, "stream": stream},
        "responses": {"model": model, "input": PROMPT, "max_output_tokens": MAX_TOKENS, "stream": stream},
        "messages": {"model": model, "messages": messages, "max_tokens": MAX_TOKENS, "stream": stream},
    }


PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


def first_token(protocol: str) -> Callable[[str], bool]:
    """Whether an SSE line carries the first generated text of `protocol`'s stream."""

    def is_text(line: str) -> bool:
        if not line.startswith("data: {"):
            return False
        event = json.loads(line[6:])
        if protocol == "chat":
            return any((c.get("delta") or {}).get("content") for c in event.get("choices") or [])
        if protocol == "messages":
            return event.get("type") == "content_block_delta"
        return event.get("type") == "response.output_text.delta"

    return is_text


def timed(client: httpx.Client, protocol: str, body: dict[str, Any]) -> float:
    """Milliseconds to the whole answer (non-streamed) or to the first generated text (streamed)."""
    is_text = first_token(protocol)
    started = time.perf_counter()
    if not body["stream"]:
        response = client.post(PATHS[protocol], json=body)
        response.raise_for_status()
        return (time.perf_counter() - started) * 1000
    elapsed = None
    with client.stream("POST", PATHS[protocol], json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():  # read to the end: the connection is reused
            if elapsed is None and is_text(line):
                elapsed = (time.perf_counter() - started) * 1000
    if elapsed is None:
        raise RuntimeError(f"{protocol}: the stream carried no text")
    return elapsed


def run_blocks(
    server: Server, model: str, stream: bool, requests: int, warmup: int, block: int
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Latencies per protocol, taken in alternating blocks; server CPU seconds per request per protocol."""
    requests_of = bodies(model, stream)
    latencies: dict[str, list[float]] = {p: [] for p in PATHS}
    cpu: dict[str, float] = dict.fromkeys(PATHS, 0.0)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=server.base_url, headers=headers, timeout=120) as client:
        for protocol in PATHS:
            for _ in range(warmup):
                timed(client, protocol, requests_of[protocol])
        while any(len(v) < requests for v in latencies.values()):
            for protocol in PATHS:
                count = min(block, requests - len(latencies[protocol]))
                before = server.cpu_seconds()
                latencies[protocol] += [timed(client, protocol, requests_of[protocol]) for _ in range(count)]
                cpu[protocol] += server.cpu_seconds() - before
    return latencies, {p: cpu[p] / max(1, len(latencies[p])) for p in PATHS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--block", type=int, default=30)
    parser.add_argument("--ttft-requests", type=int, default=60)
    parser.add_argument("--skip-streamed", action="store_true", help="skip (a')")
    parser.add_argument("--skip-ttft", action="store_true", help="skip (b)")
    args = parser.parse_args()
    out: dict[str, Any] = {"bench": "protocols", "python": platform.python_version(), "load_before": _load()}

    server = Server("traced")
    try:
        server.wait_ready()
        out["added_p50"] = added(*run_blocks(server, "instant", False, args.requests, args.warmup, args.block))
        if not args.skip_streamed:
            out["added_streamed"] = added(*run_blocks(server, "instant", True, args.requests, args.warmup, args.block))
    finally:
        server.stop()
    if not args.skip_ttft:
        server = Server("hf")
        try:
            server.wait_ready()
            warmup = max(3, args.ttft_requests // 10)
            block = max(1, args.ttft_requests // 4)
            ttft, _ = run_blocks(server, "tiny", True, args.ttft_requests, warmup, block)
        finally:
            server.stop()
        medians = {p: statistics.median(v) for p, v in ttft.items()}
        out["ttft"] = {
            "latency": {p: latency_summary(v) for p, v in ttft.items()},
            "messages_over_chat": round(medians["messages"] / medians["chat"], 3),
            "responses_over_chat": round(medians["responses"] / medians["chat"], 3),
        }
    out["load_after"] = _load()
    print(json.dumps(out))


def added(latencies: dict[str, list[float]], cpu: dict[str, float]) -> dict[str, Any]:
    """Each protocol's latency and server CPU per request, and what each bridge adds to chat's."""
    summary = {p: latency_summary(v) for p, v in latencies.items()}
    out: dict[str, Any] = {
        "latency": summary,
        "server_cpu_ms_per_request": {p: round(c * 1000, 3) for p, c in cpu.items()},
    }
    for bridge in ("messages", "responses"):
        out[f"{bridge}_minus_chat_p50_ms"] = round(summary[bridge]["p50_ms"] - summary["chat"]["p50_ms"], 3)
        out[f"{bridge}_minus_chat_cpu_ms"] = round((cpu[bridge] - cpu["chat"]) * 1000, 3)
    return out


def _load() -> list[float]:
    """The machine's load averages (1, 5, 15 minutes): how busy it was while measuring."""
    return [round(x, 2) for x in os.getloadavg()]


if __name__ == "__main__":
    main()
