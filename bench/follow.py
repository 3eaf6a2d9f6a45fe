"""Follow-mode benchmark: what the rollout lifecycle routes cost, and how fast new weights serve. ONE JSON line.

(a) `lifecycle`: sequential keep-alive requests to a server that is the proxy's front door
    (`Gateway`: rollout routing, the key, the bare app) over a SQLite store, with the lifecycle
    routes and a trivial bare route (`POST /noop`: reads the JSON body, answers `{}`); no LiteLLM,
    which these routes never reach. Per rollout: `start` (registers it), `reward`, `finish`, and
    one `noop` between each, in the same rollout prefix. Reports each route's p50 / p90 latency,
    its p50 minus the trivial route's (promised <= 1 ms each), and the server's CPU per request.
(b) `time_to_weights`: from the commit of a step's last finished rollout to that step's new weights
    serving (steps that trained; after the demo's warm start, so that returns vary), for the same batch
    (`--batch-size` hello tasks x `--group-size` rollouts) in the runner
    mode (the GRPO online loop runs the hello agent; `max_staleness` 0, so nothing samples while a
    step trains) and in the follow mode (the hello harness of examples/external_harness runs one
    round per step and waits for that step's weights before the next, so nothing samples while a
    step trains either). Median over steps 2..`--steps` (step 1 warms up); each mode in its own
    process (LiteLLM's proxy is one per process), on the tiny model, no warm start, no evaluation.

    .venv/bin/python bench/follow.py [--requests 500] [--steps 8] [--batch-size 4] [--group-size 8]
                                     [--warm-start-steps 120] [--skip-train] [--skip-lifecycle]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "external_harness"))
sys.path.insert(0, str(ROOT / "examples" / "hello_qwen"))

KEY = "sk-agl-bench-follow"


# --- (a) the lifecycle routes -------------------------------------------------------------------------


async def noop(request: Request) -> JSONResponse:
    """The trivial route: read the body, answer `{}`."""
    await request.body()
    return JSONResponse({})


def serve_lifecycle(store_path: str) -> None:
    """The server of (a), in this process until SIGTERM; prints `READY <port>`."""
    import uvicorn
    from fastapi.routing import APIRoute
    from starlette.responses import PlainTextResponse

    from agl_bridge.proxy.gateway import Gateway
    from agl_bridge.proxy.lifecycle import make_lifecycle_router
    from agl_bridge.proxy.server import bind_socket
    from agl_bridge.store.sqlite import SQLiteStore

    async def not_here(scope: Any, receive: Any, send: Any) -> None:
        await PlainTextResponse("not found", status_code=404)(scope, receive, send)

    async def main() -> None:
        async with SQLiteStore(store_path) as store:
            routes = [*make_lifecycle_router(lambda: store).routes, APIRoute("/noop", noop, methods=["POST"])]
            front = Gateway(not_here, api_key=KEY, routes=routes)
            sock = bind_socket("127.0.0.1", 0)
            config = uvicorn.Config(front, loop="asyncio", lifespan="off", log_level="warning", access_log=False)
            server = uvicorn.Server(config)
            print(f"READY {sock.getsockname()[1]}", flush=True)
            await server.serve(sockets=[sock])

    asyncio.run(main())


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_lifecycle(requests: int, warmup: int) -> dict[str, Any]:
    """(a): per-route latencies against the trivial route, and the server's CPU per request."""
    with tempfile.TemporaryDirectory(prefix="agl-bench-follow-") as directory:
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve-lifecycle", str(Path(directory) / "store.sqlite")],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline().split()[1])
            times: dict[str, list[float]] = {"noop": [], "start": [], "reward": [], "finish": []}
            with httpx.Client(headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as client:
                base = f"http://127.0.0.1:{port}"

                def timed(name: str, path: str, body: dict[str, Any], keep: bool) -> None:
                    began = time.perf_counter()
                    response = client.post(base + path, json=body)
                    elapsed = (time.perf_counter() - began) * 1000
                    assert response.status_code == 200, response.text
                    if keep:
                        times[name].append(elapsed)

                cpu_before = 0.0
                for index in range(warmup + requests):
                    keep = index >= warmup
                    if index == warmup:
                        cpu_before = cpu_seconds(server.pid)
                    prefix = f"/rollout/bench-{index}/attempt/0"
                    for name, body in (
                        ("start", {"task_id": f"task-{index % 64}"}),
                        ("reward", {"value": 1.0}),
                        ("finish", {"status": "succeeded"}),
                    ):
                        timed("noop", f"{prefix}/noop", {"value": 1.0}, keep)
                        timed(name, f"{prefix}/{name}", body, keep)
                cpu = cpu_seconds(server.pid) - cpu_before
        finally:
            server.terminate()
            server.wait(30)
    result: dict[str, Any] = {"requests_per_route": requests}
    noop_p50 = statistics.median(times["noop"])
    for name, values in times.items():
        ordered = sorted(values)
        result[f"{name}_p50_ms"] = round(statistics.median(ordered), 3)
        result[f"{name}_p90_ms"] = round(ordered[int(0.9 * len(ordered))], 3)
        if name != "noop":
            result[f"{name}_minus_noop_p50_ms"] = round(statistics.median(ordered) - noop_p50, 3)
    result["server_cpu_per_request_ms"] = round(cpu * 1000 / (6 * requests), 3)
    return result


# --- (b) time to new weights -----------------------------------------------------------------------


def _config(mode: str, run_dir: str, args: argparse.Namespace) -> Any:
    from agl_bridge.train.config import FollowConfig, GRPOConfig, WarmStartConfig

    per_mode: dict[str, Any] = (
        {"eval_every": 10_000}
        if mode == "online"
        else {"max_staleness": 1, "follow": FollowConfig(port=0, wait_report_s=60.0)}
    )
    return GRPOConfig(
        mode=mode,
        model="tiny",
        run_dir=run_dir,
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        learning_rate=3e-3,
        aggregation="token_mean",
        default_max_tokens=16,
        concurrency=32,
        checkpoint_every=10_000,
        tensorboard=False,
        warm_start=WarmStartConfig(steps=args.warm_start_steps, batch_size=16, learning_rate=2e-3),
        **per_mode,
    )


def _medians(run_dir: str) -> dict[str, Any]:
    records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    # step 1 warms up; a step whose groups all had equal returns trains and syncs nothing
    train = [r for r in records if r["phase"] == "train"][1:]
    train = [r for r in train if r["datums"]]
    return {
        "time_to_weights_s": round(statistics.median(r["time_to_weights_s"] for r in train), 4),
        "time_train_s": round(statistics.median(r["time_train_s"] for r in train), 4),
        "time_sync_s": round(statistics.median(r["time_sync_s"] for r in train), 4),
        "steps_measured": len(train),
    }


def run_mode(mode: str, run_dir: str, args: argparse.Namespace) -> dict[str, Any]:
    """One mode of (b) in this process; its medians."""
    from agent import hello_agent, prompt_for, split_numbers

    from agl_bridge.train.grpo import GRPOTrainer

    train_numbers, _, _ = split_numbers()
    pairs = [(prompt_for(n), f"I'm {n}.") for n in train_numbers]  # a warm start on every number: rewards then vary
    if mode == "online":
        config = _config("online", run_dir, args)
        GRPOTrainer(config, agent=hello_agent, tasks=train_numbers, warm_start_pairs=pairs).run()
        return _medians(run_dir)
    from harness import Harness

    failure: list[BaseException] = []

    def train() -> None:
        try:
            GRPOTrainer(_config("follow", run_dir, args), warm_start_pairs=pairs).run()
        except BaseException as error:  # reported below
            failure.append(error)

    trainer = threading.Thread(target=train)
    trainer.start()
    endpoint = Path(run_dir) / "endpoint.json"
    while not endpoint.is_file():
        assert trainer.is_alive() and not failure, failure
        time.sleep(0.2)
    where = json.loads(endpoint.read_text())
    harness = Harness(where["base_url"], where["api_key"], model="tiny", max_tokens=16, concurrency=32)
    numbers = iter(train_numbers)
    for step in range(1, args.steps + 1):
        harness.batch([next(numbers) for _ in range(args.batch_size)], args.group_size, f"s{step}")
        while not _has_step(run_dir, step):  # the next round samples with this step's weights
            assert trainer.is_alive() or failure == [], failure
            time.sleep(0.05)
    trainer.join()
    if failure:
        raise failure[0]
    return _medians(run_dir)


def _has_step(run_dir: str, step: int) -> bool:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return False
    return any(json.loads(line).get("step") == step for line in path.read_text().splitlines() if '"train"' in line)


def time_to_weights(args: argparse.Namespace) -> dict[str, Any]:
    """(b), each mode in a subprocess."""
    result: dict[str, Any] = {"batch": f"{args.batch_size} tasks x {args.group_size} rollouts", "steps": args.steps}
    for mode in ("online", "follow"):
        with tempfile.TemporaryDirectory(prefix=f"agl-bench-{mode}-") as run_dir:
            flags = ["--steps", str(args.steps), "--batch-size", str(args.batch_size)]
            flags += ["--group-size", str(args.group_size), "--warm-start-steps", str(args.warm_start_steps)]
            done = subprocess.run(
                [sys.executable, __file__, "--run", mode, "--run-dir", run_dir, *flags],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"{mode} run failed:\n{done.stderr[-4000:]}")
            result["runner" if mode == "online" else "follow"] = json.loads(done.stdout.strip().splitlines()[-1])
    result["follow_minus_runner_s"] = round(
        result["follow"]["time_to_weights_s"] - result["runner"]["time_to_weights_s"], 4
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500, help="rollouts (start + reward + finish) timed in (a)")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--warm-start-steps", type=int, default=120, help="the demo's: rewards vary")
    parser.add_argument("--skip-train", action="store_true", help="skip (b)")
    parser.add_argument("--skip-lifecycle", action="store_true", help="skip (a)")
    parser.add_argument("--serve-lifecycle", metavar="STORE", help=argparse.SUPPRESS)
    parser.add_argument("--run", choices=("online", "follow"), help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_lifecycle:
        serve_lifecycle(args.serve_lifecycle)
        return
    if args.run:
        print(json.dumps(run_mode(args.run, args.run_dir, args)))
        return
    result: dict[str, Any] = {"bench": "follow"}
    if not args.skip_lifecycle:
        result["lifecycle"] = time_lifecycle(args.requests, args.warmup)
    if not args.skip_train:
        result["time_to_weights"] = time_to_weights(args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
