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

--part throughput (two proxies vs one): `agl-bridge serve --sampler remote --workers N` (N = 1 and 2,
both started; SO_REUSEPORT on one port) on a PostgreSQL store, sampling from an instant backend
that costs next to no CPU (nginx answering every `/v1/completions` with one fixed vLLM-protocol
answer), driven by a load generator that costs next to no CPU (wrk, one thread, `--clients`
keep-alive connections, a new rollout per request) for `--seconds` per run, in `--rounds` rounds
alternating 1 and 2 (A B B A ...). Reported per N: the median requests/s (and each round's), CPU
milliseconds per request of the serve processes (parent + workers), of the PostgreSQL server, of
nginx and of wrk; and the ratio of 2 to 1 (the issue's target: >= 1.6x). Needs wrk and nginx
(Debian: `apt-get install -y wrk nginx-light`); the bench says so and stops if they are missing.

--part run (a whole run distributed on one machine): `agl-bridge train` of a hello-style agent
(plain OpenAI SDK + emit_reward, a reward that varies on the random tiny model) for `--steps` GRPO
steps, its attempts on local Ray (`--runner`), spread over the trainer's own proxy and
`--extra-proxies` `agl-bridge serve --sampler remote` processes (`proxy_urls`), all sampling from one
more process (an `agl-bridge serve` with the tiny model: the remote sampler, loading each adapter),
recording into PostgreSQL. Reported: the policy version of each step, rollouts and their outcome,
the calls each proxy served (the extra proxies' access logs), what was lost (a succeeded attempt
without its call or its reward), what was misattributed (a record under an attempt the runner did
not start, or a call whose policy version is not its step's), the trajectories the converter read
from PostgreSQL, and the wall time per step.

The PostgreSQL server is a throwaway one (`agl_bridge.testing.postgres`) unless --store URL names
a database (it must be empty or an agl_bridge store).

    .venv/bin/python bench/scale.py [--part exactness|throughput|run] [--conversations 200] [--turns 3]
                                    [--clients 64] [--seconds 20] [--rounds 4] [--store URL]
                                    [--steps 3] [--extra-proxies 1] [--runner ray|local]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib.util
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx

from agl_bridge.models.tiny import build_tiny_model
from agl_bridge.store import PostgresStore
from agl_bridge.testing.agents import VARIED_REWARD_HELLO_AGENT
from agl_bridge.testing.postgres import start_postgres
from agl_bridge.testing.proxy_process import ProxyProcess, child_env, start_proxy, start_remote_serve

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


LOAD_BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
"""Every load request's body: a new rollout each time, so every request registers a rollout and an attempt."""

WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = [[{body}]]
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {key}"
local counter = 0
local prefix = "r"
function init(args)
  prefix = args[1]
end
function request()
  counter = counter + 1
  return wrk.format(nil, "/rollout/" .. prefix .. "-" .. counter .. "/attempt/0/v1/chat/completions")
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK {{"requests": %d, "duration_us": %d, "non_2xx": %d, "socket_errors": %d, "p50_ms": %.2f, "p99_ms": %.2f}}\\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
"""
"""wrk's Lua script: each request a new rollout path (`<prefix>-<n>`), one JSON line of totals at the end."""

NGINX_CONF = """
worker_processes 1;
daemon off;
pid {folder}/nginx.pid;
error_log {folder}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {folder}/nginx-body;
  proxy_temp_path {folder}/nginx-proxy;
  fastcgi_temp_path {folder}/nginx-fastcgi;
  uwsgi_temp_path {folder}/nginx-uwsgi;
  scgi_temp_path {folder}/nginx-scgi;
  keepalive_timeout 600s;
  keepalive_requests 1000000000;
  server {{
    listen 127.0.0.1:{port};
    default_type application/json;
    location = /v1/completions {{ return 200 '{completion}'; }}
    location = /v1/models {{ return 200 '{models}'; }}
  }}
}}
"""
"""The instant backend: nginx answering every `/v1/completions` with one fixed vLLM-protocol answer (the load's
prompt ids echoed, fixed sampled ids and logprobs), and `/v1/models` with the base model only."""

TOOLS = {"wrk": "wrk", "nginx": "nginx-light"}
"""The programs --part throughput drives, with the Debian package of each."""


def missing_tools() -> list[str]:
    """The Debian packages to install for --part throughput (empty when wrk and nginx are there)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [package for tool, package in TOOLS.items() if shutil.which(tool, path=path) is None]


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


def _nginx(folder: Path, prompt_ids: list[int], response_ids: list[int]) -> tuple[subprocess.Popen[str], int]:
    """nginx serving the fixed answer on a free port (its master process, the port)."""
    choice = {
        "index": 0,
        "text": "",
        "token_ids": response_ids,
        "prompt_token_ids": prompt_ids,
        "logprobs": {"token_logprobs": [-0.5] * len(response_ids)},
        "finish_reason": "stop",
    }
    completion = json.dumps({"object": "text_completion", "model": "tiny", "choices": [choice]})
    models = json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model", "parent": None}]})
    assert not any(c in completion + models for c in "'\\$"), "nginx's quoted string must hold the JSON as is"
    port = _free_port()
    conf = folder / "nginx.conf"
    conf.write_text(NGINX_CONF.format(folder=folder, port=port, completion=completion, models=models))
    nginx = shutil.which("nginx", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))
    assert nginx is not None  # missing_tools() was checked first
    process = subprocess.Popen([nginx, "-p", str(folder), "-c", str(conf)], text=True)
    _wait_for_port(port, process)
    return process, port


def _serve(
    model_dir: Path, dsn: str, backend_port: int, workers: int, folder: Path
) -> tuple[subprocess.Popen[str], int]:
    """`serve --workers N --sampler remote` on the store, sampling from the backend (the process, its port)."""
    port = _free_port()
    log = folder / f"serve-{workers}.log"
    with log.open("w") as stderr:
        serve = subprocess.Popen(
            [AGL_BRIDGE, "serve", "--model", str(model_dir), "--workers", str(workers), "--port", str(port)]
            + ["--sampler", "remote", "--sampler-url", f"http://127.0.0.1:{backend_port}", "--no-log-requests"]
            + ["--store", dsn, "--api-key", API_KEY],
            env=child_env(),
            stdout=subprocess.DEVNULL,  # LiteLLM's start-up banner: this process prints only its JSON line
            stderr=stderr,
            text=True,
            cwd=folder,
        )
    deadline = time.monotonic() + 600
    while "agl-bridge is serving" not in log.read_text():  # printed once every worker answers
        if serve.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"agl-bridge serve --workers {workers} did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.3)
    answer = httpx.post(
        f"http://127.0.0.1:{port}/rollout/check-{workers}/attempt/0/v1/chat/completions",
        json=LOAD_BODY,
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=120,
    )
    if answer.status_code != 200:  # e.g. the backend's fixed prompt ids are not the ones this prompt encodes to
        raise RuntimeError(f"a check request to serve --workers {workers} answered {answer.status_code}: {answer.text}")
    return serve, port


def _wrk(port: int, clients: int, seconds: float, prefix: str, script: Path) -> dict[str, float]:
    """One wrk run (one thread, `clients` connections): its totals and the CPU seconds it used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        ["wrk", "-t1", f"-c{clients}", f"-d{seconds:g}s", "--timeout", "60s", "-s", str(script)]
        + [f"http://127.0.0.1:{port}", "--", prefix],
        capture_output=True,
        text=True,
        check=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = next((line for line in done.stdout.splitlines() if line.startswith("WRK ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no totals:\n{done.stdout}\n{done.stderr}")
    totals = json.loads(line[4:])
    totals["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return totals


def _throughput(
    dsn: str, pg_pid: int | None, folder: Path, clients: int, seconds: float, rounds: int
) -> dict[str, object]:
    from agl_bridge.chat import ChatCodec
    from agl_bridge.models.loading import load_tokenizer

    model_dir = build_tiny_model(folder / "tiny")
    tokenizer = load_tokenizer(model_dir)
    codec = ChatCodec(tokenizer)
    prompt_ids = codec.encode_prompt(LOAD_BODY["messages"]).token_ids
    response_ids = tokenizer("fine thanks", add_special_tokens=False)["input_ids"] + [codec.stop_token_ids[0]]
    script = folder / "load.lua"
    script.write_text(WRK_SCRIPT.format(body=json.dumps(LOAD_BODY), key=API_KEY))
    backend, backend_port = _nginx(folder, list(prompt_ids), response_ids)
    serves: dict[int, tuple[subprocess.Popen[str], int]] = {}
    runs: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    load_before = os.getloadavg()
    try:
        for workers in (1, 2):  # both up at once, so that the rounds can alternate between them
            serves[workers] = _serve(model_dir, dsn, backend_port, workers, folder)
        for workers, (_, port) in serves.items():  # connections, pools and lazy set-up warm before measuring
            _wrk(port, clients, 3, f"warm{workers}", script)
        for index in range(rounds):
            for workers in (1, 2) if index % 2 == 0 else (2, 1):  # A B B A ...: drifts in the load cancel out
                serve, port = serves[workers]
                cpu = [tree_cpu_s(pid) if pid else 0.0 for pid in (serve.pid, pg_pid, backend.pid)]
                totals = _wrk(port, clients, seconds, f"r{index}w{workers}", script)
                cpu = [
                    (tree_cpu_s(pid) if pid else 0.0) - used
                    for pid, used in zip((serve.pid, pg_pid, backend.pid), cpu, strict=True)
                ]
                totals.update(proxy_cpu_s=cpu[0], postgres_cpu_s=cpu[1], backend_cpu_s=cpu[2])
                runs[workers].append(totals)
    finally:
        for serve, _ in serves.values():
            serve.send_signal(signal.SIGINT)
        for serve, _ in serves.values():
            try:
                serve.wait(timeout=60)
            except subprocess.TimeoutExpired:
                serve.kill()
                serve.wait(timeout=30)
        backend.terminate()
        backend.wait(timeout=30)

    def summary(measured: list[dict[str, float]]) -> dict[str, object]:
        requests = sum(r["requests"] for r in measured)
        per_request = {
            f"{name}_cpu_ms_per_request": round(1000 * sum(r[key] for r in measured) / requests, 3)
            for name, key in (
                ("proxy", "proxy_cpu_s"),
                ("postgres", "postgres_cpu_s"),
                ("backend", "backend_cpu_s"),
                ("load", "cpu_s"),
            )
        }
        if pg_pid is None:
            per_request["postgres_cpu_ms_per_request"] = None
        rates = [r["requests"] / (r["duration_us"] / 1e6) for r in measured]
        return {
            "requests_per_s": round(statistics.median(rates), 1),
            "requests_per_s_by_round": [round(rate, 1) for rate in rates],
            "requests": requests,
            **per_request,
            "non_2xx": sum(r["non_2xx"] for r in measured),
            "socket_errors": sum(r["socket_errors"] for r in measured),
            "p50_ms": round(statistics.median(r["p50_ms"] for r in measured), 1),
        }

    one, two = summary(runs[1]), summary(runs[2])
    by_round = [
        round(b["requests"] / b["duration_us"] / (a["requests"] / a["duration_us"]), 2)
        for a, b in zip(runs[1], runs[2], strict=True)
    ]
    return {
        "bench": "scale_throughput",
        "store": "postgresql",
        "load": f"wrk -t1 -c{clients}, a new rollout per request",
        "backend": "nginx, a fixed /v1/completions answer",
        "clients": clients,
        "seconds": seconds,
        "rounds": rounds,
        "one_proxy": one,
        "two_proxies": two,
        "speedup": round(float(two["requests_per_s"]) / float(one["requests_per_s"]), 2),  # type: ignore[arg-type]
        "speedup_by_round": by_round,
        # Each round's two runs are back to back: their ratio is steadier than the medians' when other work comes
        # and goes on the machine.
        "speedup_median_of_rounds": round(statistics.median(by_round), 2),
        "cores": os.cpu_count(),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
    }


_CHAT_SERVED = re.compile(r"POST /v1/chat/completions rollout=(\S+) attempt=(\S+) key=\S+ status=200")


def _run(dsn: str, folder: Path, steps: int, extra_proxies: int, runner: str) -> dict[str, object]:
    if runner == "ray" and importlib.util.find_spec("ray") is None:
        raise SystemExit('--part run with --runner ray needs Ray: pip install "agl-bridge[ray]" (or --runner local)')
    model_dir = build_tiny_model(folder / "tiny")
    (folder / "agent.py").write_text(VARIED_REWARD_HELLO_AGENT)
    (folder / "tasks.jsonl").write_text("".join(f"{n}\n" for n in (7, 42, 100, 321, 5, 64, 900, 13)))
    sampler = start_proxy(folder / "sampler.sqlite", model_dir, sampler="tiny")
    extras: list[ProxyProcess] = []
    try:
        for index in range(extra_proxies):
            extras.append(
                start_remote_serve(model_dir, dsn, sampler, api_key=API_KEY, log_path=folder / f"extra-{index + 1}.log")
            )
        config = {
            "agent": f"{folder / 'agent.py'}:agent",
            "tasks": "tasks.jsonl",
            "run_dir": str(folder / "run"),
            "model": str(model_dir),
            "steps": steps,
            "batch_size": 2,
            "group_size": 4,
            "learning_rate": 3e-3,
            "default_max_tokens": 8,
            "tensorboard": False,
            "eval_every": 1000,
            "checkpoint_every": 1000,
            "store": dsn,
            "runner": runner,
            "concurrency": 8,
            "sampler": "remote",
            "sampler_urls": [sampler.base_url],
            "sampler_api_key": sampler.api_key,
            "sampler_model": "tiny",
            "adapter_dir": str(folder / "adapters"),
            "proxy_urls": [extra.base_url for extra in extras],
            "proxy_api_key": API_KEY,
        }
        (folder / "run.json").write_text(json.dumps(config))
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "agl_bridge.cli", "train", "--config", str(folder / "run.json")],
            capture_output=True,
            text=True,
            env={**child_env(), "COLUMNS": "200"},
            cwd=folder,
        )
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"agl-bridge train failed ({done.returncode}):\n{done.stderr[-3000:]}")
        served = {
            f"extra-{index + 1}": {
                tuple(m) for m in _CHAT_SERVED.findall((folder / f"extra-{index + 1}.log").read_text())
            }
            for index in range(extra_proxies)
        }
    finally:
        for proxy in (*extras, sampler):
            proxy.stop()
    records = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("phase") == "train"]
    return {
        "bench": "scale_run",
        "store": "postgresql",
        "runner": runner,
        "proxies": 1 + extra_proxies,
        "steps": steps,
        "policy_versions": [r["policy_version"] for r in train],
        **asyncio.run(_audit(dsn, served)),
        "wall_s": round(wall, 1),
        "step_s": [round(r["time_step_s"], 1) for r in train if "time_step_s" in r],
        "cores": os.cpu_count(),
    }


async def _audit(dsn: str, served: dict[str, set[tuple[str, str]]]) -> dict[str, object]:
    """What the store holds after the run, checked against what the runner started and who served what."""
    from agl_bridge.convert import ConvertOptions, convert_store
    from agl_bridge.types import AttemptStatus

    async with PostgresStore(dsn) as store:
        rollouts = await store.list_rollouts()
        started: set[tuple[str, str]] = set()
        succeeded = lost = wrong_version = calls = 0
        by_proxy: collections.Counter[str] = collections.Counter()
        for rollout in rollouts:
            step = int(str(rollout.group_id).split("-")[0][1:])  # group "s<k>-<task>": step k samples with version k
            for attempt in await store.list_attempts(rollout.rollout_id):
                key = (rollout.rollout_id, attempt.attempt_id)
                started.add(key)
                if attempt.status is not AttemptStatus.SUCCEEDED:
                    continue
                succeeded += 1
                found = [c async for c in store.iter_llm_calls(*key)]
                rewards = [r async for r in store.iter_rewards(*key)]
                lost += not found or not rewards
                wrong_version += sum(c.policy_version != step for c in found)
                calls += len(found)
                by_proxy[next((name for name, keys in served.items() if key in keys), "trainer")] += len(found)
        recorded = {(c.rollout_id, c.attempt_id) async for c in store.iter_all_calls()}
        recorded |= {(r.rollout_id, r.attempt_id) async for r in store.iter_all_rewards()}
        trajectories = [t async for t in convert_store(store, options=ConvertOptions())]
    return {
        "rollouts": len(rollouts),
        "attempts_succeeded": succeeded,
        "calls": calls,
        "calls_by_proxy": dict(sorted(by_proxy.items())),
        "lost": lost,
        "misattributed": len(recorded - started) + wrong_version,
        "trajectories_from_postgresql": len(trajectories),
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    """Parse arguments, run the asked part, print one JSON line (or serve the instant backend)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["exactness", "throughput", "run"], default="exactness")
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--proxies", type=int, default=2, help="exactness: proxies the turns alternate over")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0, help="throughput: seconds per measured run")
    parser.add_argument("--rounds", type=int, default=4, help="throughput: rounds of (1 proxy, 2 proxies) runs")
    parser.add_argument("--store", default=None, help="a postgresql:// URL (default: a throwaway server)")
    parser.add_argument("--steps", type=int, default=3, help="run: GRPO steps")
    parser.add_argument(
        "--extra-proxies", type=int, default=1, help="run: agl-bridge serve processes beside the trainer's"
    )
    parser.add_argument("--runner", choices=["ray", "local"], default="ray", help="run: where the attempts run")
    args = parser.parse_args()
    if args.part == "throughput" and (missing := missing_tools()):
        raise SystemExit(
            f"--part throughput drives wrk and nginx, which are not installed: apt-get install -y {' '.join(missing)}"
        )
    server = None if args.store else start_postgres()
    dsn = args.store or server.dsn()  # type: ignore[union-attr]
    proxies: list[ProxyProcess] = []
    try:
        with tempfile.TemporaryDirectory(prefix="agl-scale-bench-") as folder:
            if args.part == "throughput":
                result = _throughput(
                    dsn, server.pid if server else None, Path(folder), args.clients, args.seconds, args.rounds
                )
            elif args.part == "run":
                result = _run(dsn, Path(folder), args.steps, args.extra_proxies, args.runner)
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
