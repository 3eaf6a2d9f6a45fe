"""Scaling out on one machine: several proxies on one PostgreSQL store. Prints ONE JSON line per part.

--part exactness (the issue's turn-k+1 check): two proxy processes (`agl_bridge.testing.serve`,
each with the tiny model on its own HF sampler, same weights) on one PostgreSQL store; 200
conversations of 3 turns, turn t of conversation c served by proxy (c + t) % 2, so every later
turn lands on the proxy that did NOT sample the turn before. Sampling at temperature 1 makes
responses whose text re-tokenizes differently, so without the token cache recovered from the store
the prompts would not extend. Reported: turn pairs whose prompt extends the previous prompt +
sampled ids exactly, out of all; those the chat codec flagged itself (`prefix_breaks`, e.g. a
response that ended with another stop token than the template's: the same on one proxy, see
--proxies 1); and silent breaks, neither exact nor flagged (target: 0, i.e. 100% of unflagged).

--part throughput (two proxies vs one): `agl-bridge serve --sampler remote --workers N` (N = 1, then
2; SO_REUSEPORT on one port) on a PostgreSQL store, sampling from an instant remote backend (a
bare `/v1/completions` route answering fixed token ids at once: `--serve-instant`), driven by 64
concurrent keep-alive clients (new rollout per request) for `--seconds`. Reported per N: requests/s,
CPU seconds per request of the serve processes (parent + workers), of the PostgreSQL server, and
of the backend; and the ratio of 2 to 1 (the issue's target: >= 1.6x). On 2 shared cores the
clients, the backend and PostgreSQL compete with the proxies: read the CPU figures with the rates.

The PostgreSQL server is a throwaway one (`agl_bridge.testing.postgres`) unless --store URL names
a database (it must be empty or an agl_bridge store).

    .venv/bin/python bench/scale.py [--part exactness|throughput] [--conversations 200] [--turns 3]
                                    [--clients 64] [--seconds 20] [--store URL]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx

from agl_bridge.models.tiny import build_tiny_model
from agl_bridge.store import PostgresStore
from agl_bridge.testing.postgres import start_postgres
from agl_bridge.testing.proxy_process import ProxyProcess, child_env, start_proxy

API_KEY = "sk-scale-bench"
AGL_BRIDGE = str(Path(sys.executable).with_name("agl-bridge"))

CONCURRENT_CONVERSATIONS = 16


async def _converse(client: httpx.AsyncClient, proxies: list[ProxyProcess], index: int, turns: int) -> str:
    """One conversation, its turns alternating between the proxies; returns its rollout id."""
    rollout_id = f"scale-{index:04d}"
    messages: list[dict[str, str]] = [{"role": "user", "content": f"Conversation {index}: say something."}]
    for turn in range(turns):
        proxy = proxies[(index + turn) % len(proxies)]
        answer = await client.post(
            f"{proxy.rollout_url(rollout_id, '0')}/chat/completions",
            json={
                "model": "tiny",
                "messages": messages,
                "max_tokens": 16,
                "temperature": 1.0,
                "seed": index * 7 + turn,
            },
            headers={"Authorization": f"Bearer {proxy.api_key}"},
        )
        if answer.status_code != 200:
            raise RuntimeError(f"{rollout_id} turn {turn}: {answer.status_code} {answer.text}")
        reply = answer.json()["choices"][0]["message"]["content"] or ""
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"And turn {turn + 2}?"}]
    return rollout_id


async def _exactness(dsn: str, proxies: list[ProxyProcess], conversations: int, turns: int) -> dict[str, object]:
    limit = asyncio.Semaphore(CONCURRENT_CONVERSATIONS)

    async def one(client: httpx.AsyncClient, index: int) -> str:
        async with limit:
            return await _converse(client, proxies, index, turns)

    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=120) as client:
        rollout_ids = await asyncio.gather(*(one(client, i) for i in range(conversations)))
    elapsed = time.perf_counter() - started
    exact = pairs = flagged = silent = 0
    kinds: collections.Counter[str] = collections.Counter()
    async with PostgresStore(dsn) as store:
        for rollout_id in rollout_ids:
            calls = [call async for call in store.iter_llm_calls(rollout_id, "0")]
            assert len(calls) == turns, f"{rollout_id}: {len(calls)} calls stored, {turns} served"
            for call in calls:
                for found in call.prefix_breaks:
                    kinds[str(found.get("kind") if isinstance(found, dict) else found)] += 1
            for before, after in zip(calls, calls[1:], strict=False):
                expected = before.prompt_token_ids + before.response_token_ids
                pairs += 1
                extends = after.prompt_token_ids[: len(expected)] == expected
                exact += extends
                # The codec flags prompts it cannot make extend (e.g. the response ended with another stop
                # token than the template's): the converter splits there. Those happen on one proxy too.
                flagged += bool(after.prefix_breaks)
                silent += not extends and not after.prefix_breaks
    return {
        "bench": "scale_exactness",
        "proxies": len(proxies),
        "store": "postgresql",
        "conversations": conversations,
        "turns": turns,
        "turn_pairs": pairs,
        "exact": exact,
        "exact_pct": round(100 * exact / max(1, pairs), 2),
        "flagged_by_the_codec": flagged,
        "exact_pct_of_unflagged": round(100 * exact / max(1, pairs - flagged), 2),
        "silent_breaks": silent,
        "prefix_breaks": dict(kinds),
        "elapsed_s": round(elapsed, 1),
    }


def serve_instant(port: int, response_ids: list[int]) -> None:
    """The instant remote backend: `/v1/completions` answering `response_ids` for any prompt, at once."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    logprobs = [-0.5] * len(response_ids)

    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        prompt = body["prompt"]
        choice = {
            "index": 0,
            "text": "",
            "token_ids": response_ids,
            "prompt_token_ids": prompt,
            "logprobs": {"token_logprobs": logprobs},
            "finish_reason": "stop",
        }
        return JSONResponse({"object": "text_completion", "model": body.get("model"), "choices": [choice]})

    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
    # A long keep-alive: the proxies reuse pooled connections, and one closed under them fails a call.
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, timeout_keep_alive=600)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process `pid` and its direct children so far (Linux /proc)."""
    total, ticks = 0.0, os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(entry) == pid or int(fields[1]) == pid:
                total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def _snapshot_cpu(into: list[float], pids: tuple[int | None, ...]) -> None:
    """Append the CPU seconds so far of each process tree in `pids` (0 for None)."""
    into.extend(tree_cpu_s(pid) if pid else 0.0 for pid in pids)


def _wait_for_port(port: int, process: subprocess.Popen[str], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server on port {port} exited with code {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"nothing listened on port {port} within {timeout_s:g}s")


async def _load(port: int, clients: int, seconds: float, measure: Callable[[], None]) -> tuple[int, float]:
    """Requests answered, and the seconds taken, while `clients` keep-alive clients send chat calls (each a
    new rollout) for `seconds`; `measure()` is called once the connections are open and warm."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    done = 0
    async with httpx.AsyncClient(headers=headers, timeout=120, limits=limits) as client:

        async def one(rollout: str) -> None:
            url = f"http://127.0.0.1:{port}/rollout/{rollout}/attempt/0/v1/chat/completions"
            answer = await client.post(url, json=body)
            if answer.status_code != 200:
                raise RuntimeError(f"HTTP {answer.status_code}: {answer.text[:300]}")

        for _ in range(3):  # every connection and every worker's lazy set-up warm before measuring
            await asyncio.gather(*(one(f"warm-{i}-{time.monotonic_ns()}") for i in range(clients)))
        measure()
        started = time.perf_counter()
        stop_at = time.monotonic() + seconds

        async def worker(index: int) -> None:
            nonlocal done
            n = 0
            while time.monotonic() < stop_at:
                await one(f"load-{index}-{n}-{time.monotonic_ns()}")
                n += 1
                done += 1

        await asyncio.gather(*(worker(i) for i in range(clients)))
        elapsed = time.perf_counter() - started
    return done, elapsed


def _throughput(dsn: str, pg_pid: int | None, folder: Path, clients: int, seconds: float) -> dict[str, object]:
    from agl_bridge.chat import ChatCodec
    from agl_bridge.models.loading import load_tokenizer

    model_dir = build_tiny_model(folder / "tiny")
    tokenizer = load_tokenizer(model_dir)
    response_ids = tokenizer("fine thanks", add_special_tokens=False)["input_ids"] + [
        ChatCodec(tokenizer).stop_token_ids[0]
    ]
    env = child_env()
    backend_port = _free_port()
    backend = subprocess.Popen(
        [sys.executable, __file__, "--serve-instant", str(backend_port), "--ids", json.dumps(response_ids)],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    results: dict[int, dict[str, float]] = {}
    try:
        _wait_for_port(backend_port, backend)
        for workers in (1, 2):
            port = _free_port()
            serve = subprocess.Popen(
                [AGL_BRIDGE, "serve", "--model", str(model_dir), "--workers", str(workers), "--port", str(port)]
                + ["--sampler", "remote", "--sampler-url", f"http://127.0.0.1:{backend_port}"]
                + ["--store", dsn, "--api-key", API_KEY],
                env=env,
                stdout=subprocess.DEVNULL,  # LiteLLM's start-up banner: this process prints only its JSON line
                stderr=subprocess.PIPE,
                text=True,
                cwd=folder,
            )
            try:
                assert serve.stderr is not None
                for line in serve.stderr:  # printed once every worker answers
                    if line.startswith("agl-bridge is serving"):
                        break
                else:
                    raise RuntimeError(f"agl-bridge serve --workers {workers} exited ({serve.wait()})")
                threading.Thread(target=serve.stderr.read, daemon=True).start()  # keep its pipe drained
                cpu: list[float] = []
                measure = functools.partial(_snapshot_cpu, cpu, (serve.pid, pg_pid, backend.pid))
                client_cpu = time.process_time()  # includes the warm-up: an upper bound for the clients' share
                requests, elapsed = asyncio.run(_load(port, clients, seconds, measure))
                client_cpu = time.process_time() - client_cpu
                used = (tree_cpu_s(serve.pid) - cpu[0], (tree_cpu_s(pg_pid) - cpu[1]) if pg_pid else None)
                backend_cpu = tree_cpu_s(backend.pid) - cpu[2]
                results[workers] = {
                    "requests_per_s": round(requests / elapsed, 1),
                    "requests": requests,
                    "proxy_cpu_ms_per_request": round(1000 * used[0] / requests, 2),
                    "postgres_cpu_ms_per_request": None if used[1] is None else round(1000 * used[1] / requests, 2),
                    "backend_cpu_ms_per_request": round(1000 * backend_cpu / requests, 2),
                    "client_cpu_ms_per_request": round(1000 * client_cpu / requests, 2),
                }
            finally:
                serve.send_signal(signal.SIGINT)
                try:
                    serve.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    serve.kill()
                    serve.wait(timeout=30)
    finally:
        backend.terminate()
        backend.wait(timeout=30)
    return {
        "bench": "scale_throughput",
        "store": "postgresql",
        "clients": clients,
        "seconds": seconds,
        "one_proxy": results[1],
        "two_proxies": results[2],
        "speedup": round(results[2]["requests_per_s"] / results[1]["requests_per_s"], 2),
        "cores": os.cpu_count(),
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    """Parse arguments, run the asked part, print one JSON line (or serve the instant backend)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["exactness", "throughput"], default="exactness")
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--proxies", type=int, default=2, help="exactness: proxies the turns alternate over")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--store", default=None, help="a postgresql:// URL (default: a throwaway server)")
    parser.add_argument("--serve-instant", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ids", default="[]", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_instant is not None:
        serve_instant(args.serve_instant, json.loads(args.ids))
        return
    server = None if args.store else start_postgres()
    dsn = args.store or server.dsn()  # type: ignore[union-attr]
    proxies: list[ProxyProcess] = []
    try:
        with tempfile.TemporaryDirectory(prefix="agl-scale-bench-") as folder:
            if args.part == "throughput":
                result = _throughput(dsn, server.pid if server else None, Path(folder), args.clients, args.seconds)
            else:
                model_dir = build_tiny_model(Path(folder) / "tiny")
                proxies = [
                    start_proxy(dsn, model_dir, sampler="tiny", log_dir=Path(folder)) for _ in range(args.proxies)
                ]
                result = asyncio.run(_exactness(dsn, proxies, args.conversations, args.turns))
    finally:
        for proxy in proxies:
            proxy.stop()
        if server is not None:
            server.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
