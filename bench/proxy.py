"""Proxy benchmark: what our proxy adds over the bare LiteLLM proxy, and what it sustains. ONE JSON line.

(a) `in_process`: a short non-streaming chat completion through `litellm.acompletion("agl/instant")`
    with our `AglProvider` over a `ChatService` (InstantSampler, recording into a temp SQLiteStore);
    no HTTP. Also `ChatService.complete` alone (the same work without LiteLLM).
(b) `bare_http`: LiteLLM's proxy over the same instant backend (the InstantSampler behind a minimal
    CustomLLM that renders the chat template, samples and detokenizes, as any provider over a token
    sampler must), with nothing of ours: no gateway, routes, validation, recording or spans; same
    LiteLLM config and uvicorn settings. The baseline of the bound. `bare_fixed_text_http` is
    LiteLLM's proxy with a CustomLLM that returns a fixed text (no tokenizer at all), for reference.
(c) `traced_http`: `ProxyServer` over an InstantSampler: gateway, request validation, chat-template
    encoding, recording with durable commit. `traced_http_rollout` is the same through
    `/rollout/{id}/attempt/{id}/v1` (path rewrite, token cache). `c_minus_b_p50_ms` is what our
    tracing + store add, promised <= 1 ms; `c_minus_fixed_text_*` what everything of ours adds,
    the chat template and detokenizing included.
    (b) and (c) are timed with keep-alive httpx clients, sequential requests, in alternating blocks
    so that background load hits all alike, each block on the next of `--replicas` processes of
    that kind (one process's memory layout can move its latency by a few tenths of a millisecond);
    each kind's CPU time per request is reported too (steadier than wall-clock latency on a shared
    machine), and its RSS after the run.
(d) `throughput`: aggregate completion tokens/s through our proxy with the tiny model (HFSampler),
    64 max_tokens at temperature 1, 1 client vs 16 concurrent clients (httpx async), each client
    making `--hf-rounds` requests back to back; median of `--hf-repeats` runs. The chat route always
    stops at the end-of-turn token, so the tokens actually produced are counted (and the share of
    requests that ran to max_tokens is reported). `--threads` sets the server's torch intra-op
    threads; the default is `agl-bridge serve`'s (one per core but one, leaving a core to the event
    loop: with torch's own default, one per core, the sampler contends with the proxy's work). The
    sampler is `agl-bridge serve`'s (`HFProcessSampler`, in a child process); `--in-process-sampler`
    runs `HFSampler` in the server's process instead. The 1- and 16-client runs alternate.
(e) `store_ingest`: LLM calls/s into `SQLiteStore.add_llm_call` (bench/store.py's measurement,
    three 64-long lists per record).
(f) `concurrent`: requests/s and server CPU per request with 64 concurrent clients, and the
    sequential p50, for every front end side by side in interleaved rounds (`bench/_front_ends.py`):
    bare LiteLLM, ours (in-process instant sampler, plain and streamed; remote sampler in front of an
    instant backend), Agent-lightning 1.0 and the rLLM gateway (each from a venv of its own; skipped
    with the reason when not installed). `agl_bridge_cpu_vs_agentlightning` is our hot path's CPU per
    request over Agent-lightning's (the issue's bound: <= 1.0).

Every server runs in its own subprocess (LiteLLM's proxy is a process-wide singleton) on
127.0.0.1 and a free port, and is stopped (SIGTERM, then SIGKILL) before this exits.

    .venv/bin/python bench/proxy.py [--requests 500] [--warmup 50] [--block 50] [--replicas 2] [--store-records 20000]
                                    [--hf-repeats 3] [--hf-rounds 4] [--threads N] [--skip-hf] [--profile DIR]
                                    [--only-throughput] [--in-process-sampler]
                                    [--concurrent-requests 1000] [--concurrent-rounds 3] [--skip-concurrent]

`--profile DIR` runs the bare and traced servers under cProfile from the end of the warm-up on and
writes DIR/{bare,traced}.prof (latencies measured so are inflated; compare the profiles).
The servers alone: `bench/proxy.py --serve bare|bare_fixed|traced|hf [--port N] [--key K]` (prints READY <port>).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import json
import os
import platform
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from _proxy_servers import INSTANT_MODEL, INSTANT_TEXT, MESSAGES, latency_summary  # noqa: E402

API_KEY = "sk-agl-bench-key"
ROLLOUT_PREFIX = "/rollout/ro-bench/attempt/at-bench"
HF_PROMPT = "Let's play a game. Say you are 42. What do you say?"
HF_MAX_TOKENS = 64
HF_CONCURRENCY = (1, 16)
READY_TIMEOUT_S = 240.0


def _proc_status(pid: int, field: str) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _with_descendants(pid: int) -> list[int]:
    """`pid` and every process below it (Linux /proc)."""
    found, index = [pid], 0
    while index < len(found):
        try:
            with open(f"/proc/{found[index]}/task/{found[index]}/children") as children:
                found += [int(child) for child in children.read().split()]
        except OSError:
            pass
        index += 1
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """A server subprocess (`bench/proxy.py --serve KIND`), stopped by `stop`.

    It binds a free port itself (port 0) and says which in its READY line, so that servers started
    together can never race for the same port; `base_url` is known once `wait_ready` returns.
    """

    def __init__(self, kind: str, profile_path: str | None = None, extra_args: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.ready_line = ""
        self.port = 0
        self.base_url = ""
        self._log = tempfile.TemporaryFile(mode="w+")
        args = [sys.executable, str(Path(__file__).resolve()), "--serve", kind, "--port", "0", "--key", API_KEY]
        if profile_path:
            args += ["--profile", profile_path]
        args += extra_args
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._log, text=True, env=_child_env())
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:  # keep reading so that a chatty child never blocks on a full pipe
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Return once the server printed READY; raise with its log if it died or took too long."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                break
            if line.startswith("READY"):
                self.ready_line = line.strip()
                self.port = int(self.ready_line.split()[1])
                self.base_url = f"http://127.0.0.1:{self.port}"
                return
        raise RuntimeError(f"the {self.kind} server did not start (exit code {self.proc.poll()}):\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        self._log.seek(0)
        return self._log.read()[-chars:]

    def rss_mib(self) -> float | None:
        """Resident memory of the server and its children (an hf server's sampler process)."""
        sizes = [_proc_status(pid, "VmRSS") for pid in _with_descendants(self.proc.pid)]
        known = [size for size in sizes if size is not None]
        return round(sum(known), 1) if known else None

    def cpu_seconds(self) -> float:
        """CPU time of the server and its children (an hf server's sampler process)."""
        total = 0.0
        for pid in _with_descendants(self.proc.pid):
            try:
                total += cpu_seconds(pid)
            except OSError:
                pass
        return total

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (graceful: the store is closed, a profile written), SIGKILL if it does not end."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


# ------------------------------------------------------------------------------ (b) and (c)


def _chat_body(model: str) -> bytes:
    return json.dumps({"model": model, "messages": MESSAGES, "max_tokens": 16}).encode()


def time_latency(
    targets: dict[str, tuple[list[Server], str]], requests: int, warmup: int, block: int, *, profiling: bool = False
) -> dict[str, dict[str, Any]]:
    """Sequential keep-alive requests to each target, in alternating blocks of `block` requests.

    `targets` maps a name to (its server replicas, path); a target's blocks go to its replicas in
    turn, so that one process's luck (memory layout, hash seed) does not decide the figure.
    Returns each target's latency summary, its servers' CPU time per request over the measured
    phase (all targets of one server counted together) and the block-by-block p50s. With
    `profiling`, each server is told (SIGUSR1) to start its profiler after the warm-up.
    """
    import httpx

    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    clients = {
        (name, i): httpx.Client(base_url=server.base_url, headers=headers, timeout=30)
        for name, (replicas, _) in targets.items()
        for i, server in enumerate(replicas)
    }
    body = _chat_body(INSTANT_MODEL)

    def one(name: str, replica: int) -> float:
        path = targets[name][1]
        t0 = time.perf_counter()
        response = clients[name, replica].post(path, content=body)
        elapsed = (time.perf_counter() - t0) * 1e3
        if response.status_code != 200:
            raise RuntimeError(f"{name}: HTTP {response.status_code}: {response.text[:500]}")
        content = response.json()["choices"][0]["message"]["content"]
        if content != INSTANT_TEXT:
            raise RuntimeError(f"{name}: unexpected answer {content!r}")
        return elapsed

    servers = {id(server): server for replicas, _ in targets.values() for server in replicas}
    served: dict[int, int] = dict.fromkeys(servers, 0)
    try:
        for name, replica in clients:
            for _ in range(warmup):
                one(name, replica)
        if profiling:
            for server in servers.values():
                server.proc.send_signal(signal.SIGUSR1)
            time.sleep(0.2)
        cpu0 = {key: server.cpu_seconds() for key, server in servers.items()}
        timings: dict[str, list[float]] = {name: [] for name in targets}
        block_p50: dict[str, list[float]] = {name: [] for name in targets}
        for index in range(-(-requests // block)):
            for name, (replicas, _) in targets.items():
                replica = index % len(replicas)
                times = [one(name, replica) for _ in range(min(block, requests - len(timings[name])))]
                served[id(replicas[replica])] += len(times)
                timings[name].extend(times)
                block_p50[name].append(statistics.median(times))
        cpu = {key: server.cpu_seconds() - cpu0[key] for key, server in servers.items()}
    finally:
        for client in clients.values():
            client.close()
    out = {}
    for name, (replicas, path) in targets.items():
        ids = {id(server) for server in replicas}
        out[name] = {
            "path": path,
            **latency_summary(timings[name]),
            "server_cpu_ms_per_request": round(1e3 * sum(cpu[i] for i in ids) / sum(served[i] for i in ids), 3),
            "block_p50s_ms": [round(v, 3) for v in block_p50[name]],
        }
    return out


# ---------------------------------------------------------------------------------------- (d)


async def _throughput_once(base_url: str, clients: int, per_client: int) -> dict[str, float]:
    import httpx

    headers = {"Authorization": f"Bearer {API_KEY}"}
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": HF_PROMPT}],
        "max_tokens": HF_MAX_TOKENS,
        "temperature": 1.0,
    }
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=300, limits=limits) as client:

        async def request() -> tuple[int, str]:
            response = await client.post("/v1/chat/completions", json=body)
            if response.status_code != 200:
                raise RuntimeError(f"HTTP {response.status_code}: {response.text[:500]}")
            data = response.json()
            return data["usage"]["completion_tokens"], data["choices"][0]["finish_reason"]

        await asyncio.gather(*(request() for _ in range(clients)))  # opens the connections

        async def worker() -> list[tuple[int, str]]:
            return [await request() for _ in range(per_client)]

        t0 = time.perf_counter()
        results = [r for rs in await asyncio.gather(*(worker() for _ in range(clients))) for r in rs]
        elapsed = time.perf_counter() - t0
    tokens = sum(t for t, _ in results)
    return {
        "tokens_per_s": tokens / elapsed,
        "mean_completion_tokens": tokens / len(results),
        "length_fraction": sum(reason == "length" for _, reason in results) / len(results),
        "requests": len(results),
    }


def time_throughput(server: Server, repeats: int, rounds: int) -> dict[str, Any]:
    """Median over `repeats` runs of aggregate completion tokens/s for 1 and for 16 clients (the runs
    alternate), each client making `rounds` requests back to back; the server's CPU time (its
    sampler process included) per completion token."""
    runs: dict[int, list[dict[str, float]]] = {c: [] for c in HF_CONCURRENCY}
    cpu = dict.fromkeys(HF_CONCURRENCY, 0.0)
    tokens = dict.fromkeys(HF_CONCURRENCY, 0.0)
    for _ in range(repeats):  # interleaved, so that a burst of background load hits both alike
        for c in HF_CONCURRENCY:
            before = server.cpu_seconds()
            run = asyncio.run(_throughput_once(server.base_url, c, rounds))
            cpu[c] += server.cpu_seconds() - before
            tokens[c] += run["requests"] * run["mean_completion_tokens"]
            runs[c].append(run)
    rate = {c: statistics.median(r["tokens_per_s"] for r in runs[c]) for c in HF_CONCURRENCY}
    ready = dict(field.split("=", 1) for field in server.ready_line.split()[2:])
    return {
        "model": "tiny",
        "sampler": ready.get("sampler"),
        "torch_threads": int(ready["torch_threads"]) if ready.get("torch_threads", "").isdigit() else None,
        "max_tokens": HF_MAX_TOKENS,
        "temperature": 1.0,
        "repeats": repeats,
        "requests_per_run": {str(c): c * rounds for c in HF_CONCURRENCY},
        "tokens_per_s": {str(c): round(rate[c], 1) for c in HF_CONCURRENCY},
        "tokens_per_s_all_runs": {str(c): [round(r["tokens_per_s"], 1) for r in runs[c]] for c in HF_CONCURRENCY},
        "mean_completion_tokens": {
            str(c): round(statistics.fmean(r["mean_completion_tokens"] for r in runs[c]), 1) for c in HF_CONCURRENCY
        },
        "length_finish_fraction": {
            str(c): round(statistics.fmean(r["length_fraction"] for r in runs[c]), 3) for c in HF_CONCURRENCY
        },
        "server_cpu_ms_per_token": {str(c): round(1e3 * cpu[c] / tokens[c], 3) for c in HF_CONCURRENCY},
        "ratio_16_vs_1": round(rate[16] / rate[1], 2),
        "target_ratio": 6.0,
        "rss_mib_after": server.rss_mib(),
    }


# ---------------------------------------------------------------------------------------- (a), (e)


def time_inprocess(requests: int, warmup: int) -> dict[str, Any]:
    """Measurement (a), in a subprocess of its own (it sets LiteLLM's process-wide provider map)."""
    args = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--inprocess",
        "--requests",
        str(requests),
        "--warmup",
        str(warmup),
    ]
    done = subprocess.run(args, capture_output=True, text=True, env=_child_env(), timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"the in-process measurement failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def time_store_ingest(records: int) -> dict[str, Any]:
    """bench/store.py's measurement: `records` LLM calls from 64 writers, 16 calls per attempt."""
    spec = importlib.util.spec_from_file_location("agl_bench_store", BENCH_DIR / "store.py")
    assert spec is not None and spec.loader is not None
    store_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(store_bench)
    with tempfile.TemporaryDirectory(prefix="agl-bench-proxy-store-") as directory:
        result = asyncio.run(store_bench.run(records, 64, 16, "NORMAL", directory))
    return {
        "records": result["records"],
        "writers": result["writers"],
        "list_length": result["list_length"],
        "records_per_s": result["records_per_s"],
        "records_per_s_after_10k": result["records_per_s_after_10k"],
        "cpu_us_per_record": result["cpu_us_per_record"],
        "avg_batch": result["avg_batch"],
        "target_records_per_s": 20_000,
    }


# ---------------------------------------------------------------------------------------- (f)


def time_concurrent(replicas: dict[str, list[Server]], requests: int, rounds: int) -> dict[str, Any]:
    """Measurement (f): every front end under 64 concurrent clients, in interleaved rounds."""
    import _front_ends as fe

    headers = {"Authorization": f"Bearer {API_KEY}"}
    rollout_chat = f"{ROLLOUT_PREFIX}/v1/chat/completions"
    bare, traced = replicas["bare"][0], replicas["traced"][0]
    fronts = [
        fe.FrontEnd("bare_litellm", bare.proc, bare.base_url, "/v1/chat/completions", headers, fe.chat_body()),
        fe.FrontEnd("agl_bridge", traced.proc, traced.base_url, rollout_chat, headers, fe.chat_body()),
        fe.FrontEnd(
            "agl_bridge_stream", traced.proc, traced.base_url, rollout_chat, headers, fe.chat_body(stream=True)
        ),
    ]
    backend, backend_url = fe.start_backend()
    skipped: dict[str, str] = {}
    started: list[fe.FrontEnd] = []
    try:
        started.append(fe.start_remote_front(backend_url, API_KEY, _child_env()))
        for name, peer in (
            ("agentlightning_1_0", fe.start_agentlightning(backend_url, API_KEY)),
            ("rllm_gateway", fe.start_rllm(backend_url)),
        ):
            if isinstance(peer, str):
                skipped[name] = peer
            else:
                started.append(peer)
        out = fe.measure([*fronts, *started], requests=requests, rounds=rounds, sequential=200)
    finally:
        for front in started:
            front.stop()
        backend.terminate()
        backend.wait(20)
    out["skipped"] = skipped
    if "agentlightning_1_0" in out:
        peer_cpu = out["agentlightning_1_0"]["server_cpu_ms_per_request"]
        for name in ("agl_bridge", "agl_bridge_stream", "agl_bridge_remote"):
            out[f"{name}_cpu_vs_agentlightning"] = round(out[name]["server_cpu_ms_per_request"] / peer_cpu, 2)
    return out


# ---------------------------------------------------------------------------------------- main


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for package in ("litellm", "uvicorn", "fastapi", "httpx", "torch", "transformers"):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def _hf_server(args: argparse.Namespace) -> Server:
    """The (d) server, started (not yet ready)."""
    extra = ("--threads", str(args.threads)) if args.threads else ()
    return Server("hf", extra_args=extra + (("--in-process-sampler",) if args.in_process_sampler else ()))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """All measurements; servers are stopped whatever happens."""
    result: dict[str, Any] = {
        "bench": "proxy",
        "machine": {"cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg()[0], **_versions()},
        "requests": args.requests,
        "warmup": args.warmup,
    }
    t_start = time.perf_counter()
    if args.only_throughput:
        hf_only = _hf_server(args)
        try:
            hf_only.wait_ready()
            result["throughput"] = time_throughput(hf_only, args.hf_repeats, args.hf_rounds)
        finally:
            hf_only.stop()
        result["machine"]["loadavg_at_end"] = os.getloadavg()[0]
        result["elapsed_s"] = round(time.perf_counter() - t_start, 1)
        return result
    result["in_process"] = time_inprocess(args.requests, args.warmup)

    profile = {kind: str(Path(args.profile) / f"{kind}.prof") for kind in ("bare", "traced")} if args.profile else {}
    servers: list[Server] = []
    try:
        replicas: dict[str, list[Server]] = {}
        for kind in ("bare", "bare_fixed", "traced"):
            replicas[kind] = [Server(kind, profile.get(kind) if i == 0 else None) for i in range(args.replicas)]
            servers += replicas[kind]
        hf = None
        if not args.skip_hf:
            hf = _hf_server(args)
            servers.append(hf)
        for server in servers:
            server.wait_ready()
        rss_before = {kind: replicas[kind][0].rss_mib() for kind in ("bare", "traced")}
        latency = time_latency(
            {
                "bare_http": (replicas["bare"], "/v1/chat/completions"),
                "bare_fixed_text_http": (replicas["bare_fixed"], "/v1/chat/completions"),
                "traced_http": (replicas["traced"], "/v1/chat/completions"),
                "traced_http_rollout": (replicas["traced"], f"{ROLLOUT_PREFIX}/v1/chat/completions"),
            },
            args.requests,
            args.warmup,
            args.block,
            profiling=bool(args.profile),
        )
        for kind, name in (("bare", "bare_http"), ("traced", "traced_http")):
            latency[name]["rss_mib_before"] = rss_before[kind]
            latency[name]["rss_mib_after"] = replicas[kind][0].rss_mib()
        result.update(latency)
        result["replicas"] = args.replicas
        for label, baseline in (("c_minus_b", "bare_http"), ("c_minus_fixed_text", "bare_fixed_text_http")):
            b, c = latency[baseline], latency["traced_http"]
            result[f"{label}_p50_ms"] = round(c["p50_ms"] - b["p50_ms"], 3)
            result[f"{label}_median_of_block_p50s_ms"] = round(
                statistics.median(x - y for x, y in zip(c["block_p50s_ms"], b["block_p50s_ms"], strict=True)), 3
            )
            result[f"{label}_server_cpu_ms_per_request"] = round(
                c["server_cpu_ms_per_request"] - b["server_cpu_ms_per_request"], 3
            )
        result["target_c_minus_b_p50_ms"] = 1.0
        if not args.skip_concurrent:
            result["concurrent"] = time_concurrent(replicas, args.concurrent_requests, args.concurrent_rounds)
        for server in servers:
            if server is not hf:
                server.stop()
        if hf is not None:
            result["throughput"] = time_throughput(hf, args.hf_repeats, args.hf_rounds)
            hf.stop()
    finally:
        for server in servers:
            server.stop()
    result["store_ingest"] = time_store_ingest(args.store_records)
    result["machine"]["loadavg_at_end"] = os.getloadavg()[0]
    result["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    return result


def main() -> None:
    """Run the benchmark and print one JSON line (or act as one of its servers, see --serve)."""
    if "--serve" in sys.argv or "--inprocess" in sys.argv:
        import _proxy_servers

        _proxy_servers.main(sys.argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500, help="measured requests per latency target")
    parser.add_argument("--warmup", type=int, default=50, help="warm-up requests per latency target")
    parser.add_argument("--block", type=int, default=50, help="requests per target before switching target")
    parser.add_argument(
        "--replicas", type=int, default=2, help="server processes of each kind the latency blocks rotate over"
    )
    parser.add_argument("--hf-repeats", type=int, default=3, help="median of this many throughput runs")
    parser.add_argument("--hf-rounds", type=int, default=4, help="requests each throughput client makes per run")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads of the (d) server (default: agl-bridge serve's)",
    )
    parser.add_argument("--skip-hf", action="store_true", help="skip (d)")
    parser.add_argument("--only-throughput", action="store_true", help="run (d) alone")
    parser.add_argument(
        "--in-process-sampler",
        action="store_true",
        help="(d): the hf sampler in the server's process (agl-bridge serve --no-sampler-process)",
    )
    parser.add_argument("--concurrent-requests", type=int, default=1000, help="(f): requests per front end per round")
    parser.add_argument("--concurrent-rounds", type=int, default=3, help="(f): interleaved rounds (medians)")
    parser.add_argument("--skip-concurrent", action="store_true", help="skip (f)")
    parser.add_argument("--store-records", type=int, default=20_000)
    parser.add_argument("--profile", metavar="DIR", default=None, help="cProfile the bare and traced servers into DIR")
    args = parser.parse_args()
    # A SIGTERM ends the run like Ctrl-C: the `finally` blocks stop every server started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    print(json.dumps(run(args)))


if __name__ == "__main__":
    main()
