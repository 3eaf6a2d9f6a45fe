"""Added latency of a remote sampler: the proxy in front of a second server vs calling that server directly.

Two processes on 127.0.0.1:
  target: `ProxyServer` over an `InstantSampler` (`bench/proxy.py --serve traced`: model "instant",
          no model compute, every call recorded into its own store).
  front:  `agl-bridge serve --sampler remote --sampler-url <target>` with the tiny tokenizer,
          serving "instant" and recording every call too.

Measured with sequential keep-alive requests, in alternating blocks so both see the same machine:
  chat_direct / chat_front: `/v1/chat/completions` on the target vs through the front. The front
      does what the target does (LiteLLM, chat template, record) plus one `/v1/completions` round
      trip to the target, whose completions route samples and records too.
  completions_direct / completions_front: token-id `/v1/completions` on each.
`*_added.p50_ms` = front p50 - direct p50 (the issue's bound: <= 2 ms for chat);
`block_paired_p50_ms` = the median over blocks of (front block p50 - direct block p50), which is
steadier when other work shares the machine.

    .venv/bin/python bench/remote.py [--requests 400] [--warmup 50] [--block 50]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from _proxy_servers import INSTANT_MODEL, INSTANT_TEXT, MESSAGES, latency_summary
from proxy import API_KEY, Server, _child_env

AGL_BRIDGE = str(Path(sys.executable).with_name("agl-bridge"))
_SERVING = re.compile(r"at (?P<url>http://127\.0\.0\.1:\d+)/v1")


class Front:
    """`agl-bridge serve --sampler remote` in a subprocess, in front of `target_url`."""

    def __init__(self, target_url: str, folder: Path) -> None:
        self.proc = subprocess.Popen(
            [
                AGL_BRIDGE,
                "serve",
                "--model",
                "tiny",
                "--served-model-name",
                INSTANT_MODEL,
                "--port",
                "0",
                "--store",
                str(folder / "front.sqlite"),
                "--api-key",
                API_KEY,
                "--sampler",
                "remote",
                "--sampler-url",
                target_url,
                "--sampler-api-key",
                API_KEY,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=_child_env(),
        )
        self.base_url = ""
        self._ready = threading.Event()
        self._log: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._log.append(line)
            if not self.base_url and (match := _SERVING.search(line)):
                self.base_url = match["url"]
                self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout: float = 180) -> None:
        """Return once the front serves; raise with its log if it died."""
        if not self._ready.wait(timeout) or not self.base_url:
            raise RuntimeError("the front proxy did not start:\n" + "".join(self._log[-40:]))

    def stop(self) -> None:
        """Ctrl-C, then kill."""
        if self.proc.poll() is None:
            self.proc.send_signal(2)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def measure(target: str, front: str, requests: int, warmup: int, block: int) -> dict[str, dict[str, float]]:
    """p50/p99/mean per target in ms, from alternating blocks of sequential keep-alive requests."""
    import httpx

    from agl_bridge.models.loading import load_tokenizer

    prompt_ids = list(load_tokenizer("tiny")("Hello there, how are you?", add_special_tokens=False)["input_ids"])
    chat = json.dumps({"model": INSTANT_MODEL, "messages": MESSAGES, "max_tokens": 16}).encode()
    completion = json.dumps(
        {"model": INSTANT_MODEL, "prompt": prompt_ids, "max_tokens": 16, "logprobs": 0, "return_token_ids": True}
    ).encode()
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    plans = {
        "chat_direct": (target, "/v1/chat/completions", chat),
        "chat_front": (front, "/v1/chat/completions", chat),
        "completions_direct": (target, "/v1/completions", completion),
        "completions_front": (front, "/v1/completions", completion),
    }
    clients = {name: httpx.Client(base_url=url, headers=headers, timeout=30) for name, (url, _, _) in plans.items()}

    def one(name: str) -> float:
        _, path, body = plans[name]
        t0 = time.perf_counter()
        response = clients[name].post(path, content=body)
        elapsed = (time.perf_counter() - t0) * 1e3
        if response.status_code != 200:
            raise RuntimeError(f"{name}: HTTP {response.status_code}: {response.text[:300]}")
        choice = response.json()["choices"][0]
        if path.endswith("chat/completions") and choice["message"]["content"] != INSTANT_TEXT:
            raise RuntimeError(f"{name}: unexpected answer {choice['message']['content']!r}")
        if path.endswith("/v1/completions") and not choice.get("token_ids"):
            raise RuntimeError(f"{name}: no token_ids in {choice}")
        return elapsed

    timings: dict[str, list[float]] = {name: [] for name in plans}
    block_p50: dict[str, list[float]] = {name: [] for name in plans}
    try:
        for name in plans:
            for _ in range(warmup):
                one(name)
        while any(len(t) < requests for t in timings.values()):
            for name in plans:
                times = [one(name) for _ in range(min(block, requests - len(timings[name])))]
                timings[name].extend(times)
                block_p50[name].append(statistics.median(times))
    finally:
        for client in clients.values():
            client.close()
    out: dict[str, dict[str, float]] = {name: latency_summary(values) for name, values in timings.items()}
    for kind in ("chat", "completions"):
        # Paired by block (the two ran back to back), so load that drifts over the run cancels out.
        pairs = zip(block_p50[f"{kind}_front"], block_p50[f"{kind}_direct"], strict=True)
        out[f"{kind}_added"] = {"block_paired_p50_ms": round(statistics.median(f - d for f, d in pairs), 3)}
    return out


def main() -> None:
    """Start both servers, measure, print one JSON document."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--block", type=int, default=50)
    args = parser.parse_args()
    target = Server("traced")
    front: Front | None = None
    with tempfile.TemporaryDirectory(prefix="agl-bench-remote-") as folder:
        try:
            target.wait_ready()
            front = Front(target.base_url, Path(folder))
            front.wait_ready()
            results = measure(target.base_url, front.base_url, args.requests, args.warmup, args.block)
        finally:
            if front is not None:
                front.stop()
            target.stop()
    for kind in ("chat", "completions"):
        direct, through = results[f"{kind}_direct"], results[f"{kind}_front"]
        results[f"{kind}_added"].update(
            p50_ms=round(through["p50_ms"] - direct["p50_ms"], 3),
            p99_ms=round(through["p99_ms"] - direct["p99_ms"], 3),
            mean_ms=round(through["mean_ms"] - direct["mean_ms"], 3),
        )
    results["bound"] = {"chat_added_p50_ms_max": 2.0, "met": results["chat_added"]["p50_ms"] <= 2.0}
    results["machine"] = {
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "python": sys.version.split()[0],
    }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
