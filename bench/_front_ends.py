"""The front ends `bench/proxy.py` loads with 64 concurrent clients, side by side in one run.

Every front end answers the same short chat request in front of the same instant backend
(`_instant_backend.py`), or an instant sampler in its own process; each is one process with one
event loop, so its requests/s at 64 clients is bounded by 1 / (its CPU per request):

- `bare_litellm`: LiteLLM's proxy over a minimal CustomLLM (`--serve bare`, as in (b)).
- `agl_bridge`: our proxy over the in-process instant sampler, routed to a rollout, recording every
  call durably (`--serve traced`); `agl_bridge_stream` the same request streamed.
- `agl_bridge_remote`: `agl-bridge serve --sampler remote` in front of the instant backend's
  token-id `/v1/completions` (what a GPU deployment with vLLM does).
- `agentlightning_1_0`: Agent-lightning 1.0's server (`agl-server`, an httpx reverse proxy keeping
  events in memory), and `rllm_gateway`: the rLLM model gateway (SQLite capture). Each runs from a
  venv of its own under `--peers-dir` (they need Python 3.12 and their own dependencies):

      P=~/.cache/agl_bridge/peers
      /root/.pyenv/versions/3.12.1/bin/python -m venv $P/agl && $P/agl/bin/pip install agentlightning==1.0.2
      /root/.pyenv/versions/3.12.1/bin/python -m venv $P/rllm && $P/rllm/bin/pip install rllm-model-gateway==0.1.0

  A peer whose venv is missing is reported as skipped.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
CONCURRENCY = 64
PEERS_DIR = Path(os.environ.get("AGL_BENCH_PEERS", Path.home() / ".cache" / "agl_bridge" / "peers"))
_ROLLOUT = "ro-bench"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class FrontEnd:
    """One front end: its process, the URL and path to load, the headers and body to send."""

    name: str
    proc: subprocess.Popen[str]
    base_url: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    log: Any = None
    results: list[dict[str, float]] = field(default_factory=list)
    retries: int = 0

    def cpu_seconds(self) -> float:
        """CPU time of the front end's process (and its children) so far."""
        pids = [self.proc.pid, *_children(self.proc.pid)]
        return sum(_cpu_seconds(pid) for pid in pids if Path(f"/proc/{pid}").exists())

    def stop(self) -> None:
        """Terminate (then kill) the process."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            return [int(c) for c in children.read().split()]
    except OSError:
        return []


def _spawn(
    args: list[str], env: dict[str, str] | None = None, cwd: str | None = None
) -> tuple[subprocess.Popen[str], Any]:
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
    return proc, log


def _wait_http(url: str, proc: subprocess.Popen[str], log: Any, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"{url} exited ({proc.returncode}):\n{log.read()[-3000:]}")
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f}s")


def start_backend() -> tuple[subprocess.Popen[str], str]:
    """The instant backend; returns the process and its base URL (without /v1)."""
    port = _free_port()
    proc, log = _spawn([sys.executable, str(BENCH_DIR / "_instant_backend.py"), "--port", str(port)])
    base = f"http://127.0.0.1:{port}"
    _wait_http(f"{base}/health", proc, log)
    return proc, base


def chat_body(model: str = "instant", *, stream: bool = False) -> dict[str, Any]:
    """The short chat request every front end answers."""
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
    if stream:
        body["stream"] = True
    return body


def start_remote_front(backend: str, api_key: str, env: dict[str, str]) -> FrontEnd:
    """`agl-bridge serve --sampler remote` in front of the backend (tiny tokenizer, model "instant")."""
    port = _free_port()
    store = Path(tempfile.mkdtemp(prefix="agl-bench-front-")) / "front.sqlite"
    args = [
        sys.executable,
        "-m",
        "agl_bridge.cli",
        "serve",
        "--model",
        "tiny",
        "--served-model-name",
        "instant",
        "--sampler",
        "remote",
        "--sampler-url",
        backend,
        "--port",
        str(port),
        "--api-key",
        api_key,
        "--store",
        str(store),
    ]
    proc, log = _spawn(args, env)
    base = f"http://127.0.0.1:{port}"
    _wait_http(f"{base}/health/liveliness", proc, log)
    headers = {"Authorization": f"Bearer {api_key}"}
    path = f"/rollout/{_ROLLOUT}/attempt/a/v1/chat/completions"
    return FrontEnd("agl_bridge_remote", proc, base, path, headers, chat_body(), log)


def start_agentlightning(backend: str, api_key: str) -> FrontEnd | str:
    """Agent-lightning 1.0's server over the backend, one rollout registered; a reason if not installed."""
    server = PEERS_DIR / "agl" / "bin" / "agl-server"
    if not server.exists():
        return f"not installed: {server} (see bench/_front_ends.py)"
    port = _free_port()
    args = [str(server), "host=127.0.0.1", f"port={port}", f"key={api_key}", "default_proxy.model_name=instant"]
    scratch = tempfile.mkdtemp(prefix="agl-bench-agentlightning-")
    args += [f"hydra.run.dir={scratch}", "hydra.output_subdir=null"]  # Hydra would write outputs/ into the cwd
    proc, log = _spawn(args, {**os.environ, "HYDRA_FULL_ERROR": "1"}, cwd=scratch)
    base = f"http://127.0.0.1:{port}"
    _wait_http(f"{base}/healthz", proc, log)
    headers = {"Authorization": f"Bearer {api_key}"}
    httpx.post(f"{base}/api/models", json=[{"model": "instant", "endpoint": f"{backend}/v1"}], headers=headers)
    httpx.post(f"{base}/api/rollouts", json=[{"input": "bench", "rollout_id": _ROLLOUT}], headers=headers)
    path = f"/proxy/rollout/{_ROLLOUT}/attempt/a/mode/train/openai/v1/chat/completions"
    return FrontEnd("agentlightning_1_0", proc, base, path, headers, chat_body(), log)


def start_rllm(backend: str) -> FrontEnd | str:
    """The rLLM model gateway over the backend, capturing into SQLite; a reason if not installed."""
    gateway = PEERS_DIR / "rllm" / "bin" / "rllm-model-gateway"
    if not gateway.exists():
        return f"not installed: {gateway} (see bench/_front_ends.py)"
    port = _free_port()
    db = Path(tempfile.mkdtemp(prefix="agl-bench-rllm-")) / "traces.db"
    args = [str(gateway), "--host", "127.0.0.1", "--port", str(port), "--worker", f"{backend}/v1"]
    args += ["--store", "sqlite", "--db-path", str(db), "--log-level", "WARNING"]
    proc, log = _spawn(args)
    base = f"http://127.0.0.1:{port}"
    _wait_http(f"{base}/health", proc, log)
    return FrontEnd("rllm_gateway", proc, base, f"/sessions/{_ROLLOUT}/v1/chat/completions", {}, chat_body(), log)


async def _load(front: FrontEnd, requests: int, clients: int) -> float:
    """Send `requests` requests over `clients` concurrent keep-alive connections; the wall time taken."""
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=front.base_url, headers=front.headers, timeout=120, limits=limits) as client:

        async def one() -> None:
            try:
                response = await client.post(front.path, json=front.body)
            except httpx.TransportError:  # a pooled connection the server closed as it was reused: once more
                front.retries += 1
                response = await client.post(front.path, json=front.body)
            answered = b"I'm here." in response.content or b"data: [DONE]" in response.content
            if response.status_code != 200 or not answered:
                raise RuntimeError(f"{front.name}: HTTP {response.status_code}: {response.text[:300]}")

        await asyncio.gather(*(one() for _ in range(clients)))  # opens the connections
        left = requests

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await one()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        return time.perf_counter() - started


def _sequential_ms(front: FrontEnd, requests: int) -> list[float]:
    with httpx.Client(base_url=front.base_url, headers=front.headers, timeout=60) as client:
        times = []
        for _ in range(requests):
            started = time.perf_counter()
            response = client.post(front.path, json=front.body)
            times.append((time.perf_counter() - started) * 1e3)
            if response.status_code != 200:
                raise RuntimeError(f"{front.name}: HTTP {response.status_code}: {response.text[:300]}")
    return times


def measure(fronts: list[FrontEnd], *, requests: int, rounds: int, sequential: int) -> dict[str, Any]:
    """Interleaved rounds: each front end takes `requests` requests from 64 clients in turn, `rounds` times.

    Reports per front end the medians over rounds of requests/s and of its process's CPU time per
    request, and the p50 of `sequential` one-at-a-time requests.
    """
    for front in fronts:
        asyncio.run(_load(front, 2 * CONCURRENCY, CONCURRENCY))  # warm-up
    seq = {front.name: statistics.median(_sequential_ms(front, sequential)) for front in fronts}
    for _ in range(rounds):
        for front in fronts:
            cpu0 = front.cpu_seconds()
            wall = asyncio.run(_load(front, requests, CONCURRENCY))
            cpu = front.cpu_seconds() - cpu0
            front.results.append({"rps": requests / wall, "cpu_ms": 1e3 * cpu / requests})
    out: dict[str, Any] = {"clients": CONCURRENCY, "requests_per_round": requests, "rounds": rounds}
    for front in fronts:
        out[front.name] = {
            "seq_p50_ms": round(seq[front.name], 3),
            "requests_per_s": round(statistics.median(r["rps"] for r in front.results), 1),
            "server_cpu_ms_per_request": round(statistics.median(r["cpu_ms"] for r in front.results), 3),
            "rounds_rps": [round(r["rps"], 1) for r in front.results],
            "rounds_cpu_ms": [round(r["cpu_ms"], 3) for r in front.results],
            "transport_retries": front.retries,
        }
    return out
