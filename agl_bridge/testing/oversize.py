"""Oversized requests against a proxy while small ones are timed: does one huge request stall the others?

An agent with a huge tool output sends megabytes. `measure_oversize` times small chat requests from
a few rollouts with the proxy idle and, in alternating blocks, while another process keeps sending oversized
requests (a 10 MB body with its length declared, the same chunked, a 3.5 MB prompt that cannot fit
the tiny model's context, a 30,000-character one that must be tokenized to know), and reports both
p99s, the refusals seen, and how far the proxy's peak RSS rose. The proxy is to be started with
`LIMIT_BYTES` as its body limit (its default grows with the model's context window). Used by
`tests/reliability/test_reliability_oversize.py` and `bench/proxy_oversize.py`.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agl_bridge.testing.proxy_process import ProxyProcess

SMALL_CLIENTS = 4
LIMIT_BYTES = 4 * 1024 * 1024
"""The body limit to start the proxy with: the 10 MB requests are over it, the 3.5 MB one under it."""


@dataclass
class OversizeReport:
    """Small-request latencies (ms) idle and under oversized load; the refusals; peak RSS growth (MiB)."""

    idle_ms: list[float]
    loaded_ms: list[float]
    refusals: Counter[tuple[int, str]]
    rss_before_mib: float
    rss_growth_mib: float
    rounds: int = 1

    @property
    def paired_p99_ratio(self) -> float:
        """The median over rounds of (loaded block p99 / the idle block p99 just before it).

        Each pair is measured within seconds, so load from outside that comes and goes moves both
        alike; a stall the oversized requests cause shows in every pair, a passing spike in one.
        """
        size = len(self.idle_ms) // self.rounds
        blocks = range(0, size * self.rounds, size)
        return statistics.median(
            percentile(self.loaded_ms[start : start + size], 99) / percentile(self.idle_ms[start : start + size], 99)
            for start in blocks
        )

    @property
    def idle_p99_ms(self) -> float:
        """p99 of the small requests with nothing else sent."""
        return percentile(self.idle_ms, 99)

    @property
    def loaded_p99_ms(self) -> float:
        """p99 of the small requests while oversized ones were refused."""
        return percentile(self.loaded_ms, 99)

    def summary(self) -> dict[str, Any]:
        """The figures, rounded, for a JSON line or an assertion message."""
        return {
            "small_requests": len(self.idle_ms),
            "idle_p50_ms": round(statistics.median(self.idle_ms), 2),
            "idle_p99_ms": round(self.idle_p99_ms, 2),
            "loaded_p50_ms": round(statistics.median(self.loaded_ms), 2),
            "loaded_p99_ms": round(self.loaded_p99_ms, 2),
            "p99_ratio": round(self.loaded_p99_ms / self.idle_p99_ms, 2),
            "paired_p99_ratio": round(self.paired_p99_ratio, 2),
            "rounds": self.rounds,
            "refusals": {f"{status} {code}": count for (status, code), count in sorted(self.refusals.items())},
            "rss_before_mib": round(self.rss_before_mib, 1),
            "rss_peak_growth_mib": round(self.rss_growth_mib, 1),
        }


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, -(-len(ordered) * int(p) // 100) - 1)]


def measure_oversize(proxy: ProxyProcess, small_requests: int = 240, rounds: int = 8) -> OversizeReport:
    """Time `small_requests` small requests idle and as many while oversized ones are sent (from another process).

    Idle and loaded blocks alternate over `rounds`, so load from outside (other processes on the machine)
    that comes and goes falls on both alike rather than on whichever phase it happened to meet.
    """
    headers = {"Authorization": f"Bearer {proxy.api_key}", "Content-Type": "application/json"}
    per_block = max(SMALL_CLIENTS, small_requests // rounds)
    asyncio.run(_small_latencies(proxy, headers, per_block))  # warm-up
    rss_before = _status_mib(proxy.process.pid, "VmRSS")
    # Another process, as another agent would: sending megabytes would otherwise hold this process's
    # GIL and delay the small requests' own client.
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    sending, paused, stop = context.Event(), context.Event(), context.Event()
    sender = context.Process(
        target=_send_oversized, args=(proxy.rollout_url("ro-huge", "a0"), headers, sending, paused, stop, answers)
    )
    sender.start()
    idle: list[float] = []
    loaded: list[float] = []
    refusals: Counter[tuple[int, str]] = Counter()
    try:
        for _ in range(rounds):
            idle += asyncio.run(_small_latencies(proxy, headers, per_block))
            sending.set()
            refusals[answers.get(timeout=120)] += 1  # the sender is under way
            loaded += asyncio.run(_small_latencies(proxy, headers, per_block))
            sending.clear()
            if not paused.wait(timeout=120):
                raise AssertionError("the oversized sender did not pause within 120 s")
    finally:
        stop.set()
        sending.set()
        sender.join(120)
        if sender.is_alive():
            sender.kill()
    while not answers.empty():
        refusals[answers.get(timeout=10)] += 1
    growth = _status_mib(proxy.process.pid, "VmHWM") - rss_before
    return OversizeReport(idle, loaded, refusals, rss_before, growth, rounds)


def _chat_body(text: str) -> bytes:
    return json.dumps({"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 4}).encode()


async def _small_latencies(proxy: ProxyProcess, headers: dict[str, str], requests: int) -> list[float]:
    """`requests` short chat requests from SMALL_CLIENTS rollouts at once; each one's latency in ms."""
    times: list[float] = []

    async def rollout(index: int) -> None:
        async with httpx.AsyncClient(base_url=proxy.rollout_url(f"ro-small-{index}", "a0"), headers=headers) as client:
            for _ in range(requests // SMALL_CLIENTS):
                started = time.perf_counter()
                response = await client.post("/chat/completions", content=_chat_body("hello"), timeout=60)
                times.append((time.perf_counter() - started) * 1e3)
                if response.status_code != 200:
                    raise AssertionError(f"a small request failed: HTTP {response.status_code}: {response.text}")

    await asyncio.gather(*(rollout(i) for i in range(SMALL_CLIENTS)))
    return times


def _send_oversized(base_url: str, headers: dict[str, str], sending: Any, paused: Any, stop: Any, answers: Any) -> None:
    """While `sending` is set, send oversized requests one after another; put each (status, code) on `answers`.

    `paused` is set while the sender waits for `sending`: no oversized request is in flight then.
    """
    words = _chat_body("word " * 2_000_000)  # 10 MB: far over the limit
    cannot_fit = _chat_body("word " * 700_000)  # 3.5 MB: under the limit, but no 3.5 MB text fits 64k tokens
    # 30,000 CJK characters: by their length as few as 469 tokens (16 bytes a token, NFC), so they must be
    # tokenized to know; the tiny tokenizer makes ~90,000 tokens of them (3 bytes each), over a 64k window.
    might_fit = _chat_body("".join(chr(0x4E00 + (i * 7919) % 20_000) for i in range(30_000)))

    def chunked() -> Iterator[bytes]:  # no Content-Length: refused once it grows past the limit
        for start in range(0, len(words), 1 << 20):
            yield words[start : start + (1 << 20)]

    bodies: list[Callable[[], bytes | Iterator[bytes]]] = [
        lambda: words,
        chunked,
        lambda: cannot_fit,
        lambda: might_fit,
    ]
    sent = 0
    with httpx.Client(base_url=base_url, headers=headers, timeout=60) as client:
        while not stop.is_set():
            if not sending.is_set():
                paused.set()
                sending.wait()
                paused.clear()
                continue
            response = client.post("/chat/completions", content=bodies[sent % len(bodies)]())
            answers.put((response.status_code, str(response.json()["error"]["code"])))
            sent += 1


def _status_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")
