"""The same importance-sampling steps through the Tinker wire (the unmodified `tinker` SDK against
`agl-bridge serve-tinker`, in this process) and in-process (`TrainingClient`), on the tiny model; then
what the wire costs per call, against the server run as a user runs it.

Part 1. Each step: the SDK samples `--group` replies to a prompt from a pinned snapshot, the replies
become importance-sampling datums (the sampler's logprobs, ±1 advantages), and both clients run
forward_backward + optim_step on them with the same LoRA (rank 8, seed 0, unembedding trained, as
the SDK asks by default) and Adam settings. Reports the largest relative difference of the two losses
over the steps, the largest |ratio − 1| of sampler vs trainer probabilities on the sampled tokens (the
wire's trainer logprobs against the wire's sampler logprobs: the on-policy step must see ratio 1), and
the median wall time of a step through the wire and in-process.

Part 2, the wire's overhead per call. The servers run in their own processes, so that none shares
this process's GIL with the SDK: `agl-bridge serve-tinker` (tiny model, CPU) as a user starts it, and
two null Tinker servers (`--null-server`, below) that do no work and answer every route the SDK needs
with canned results: one returns each result on the first poll, the other holds forward_backward and
sample results `HOLD_MS` after the call arrived, as a server that computes would. The SDK in this
process makes the same calls to all three, interleaved, `--calls` times after a warm-up: a
`forward_backward` of one 16-token cross_entropy datum on a LoRA training client, and a one-token
`sample` on a base-model sampling client; the one-token sample is also run on an in-process
`HFSampler` of the tiny model, the compute reference. For each call, p50 in milliseconds:

- overhead: SDK wall time against serve-tinker less the compute (for forward_backward the server's
  own `time_s:max` metric of that call; for sample the in-process sampler's p50);
- SDK floor: SDK wall time against the holding null server, less the hold. Every SDK 0.38 call is
  two HTTP requests through the SDK's client and its event-loop thread: the call, answered with a
  future id, then `retrieve_future`, which waits for the result. That cost is paid against any
  server, however fast, so no server brings the overhead below it, and it is subtracted to leave
  what the server adds. The poll is sent while the server works, so against a server that computes
  for a few milliseconds its cost is partly hidden; against the instant null server it is not (the
  `..._sdk_ms_p50_instant_server` figures, a few milliseconds higher). The floor is measured the
  way the overhead is: with work to hide the poll behind;
- server share: overhead less the floor, what serve-tinker itself adds (routing, decoding, queueing
  the work, handing the result back).

Prints one JSON line with both parts' figures.

    .venv/bin/python bench/tinker_wire.py [--steps 5] [--group 8] [--max-tokens 24] [--calls 50]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("TINKER_TELEMETRY", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import numpy as np
import tinker
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from tinker import types
from tinker.proto import tinker_public_pb2 as pb

from agl_bridge.primitives import AdamParams, Datum, TrainingClient
from agl_bridge.proxy.server import bind_socket
from agl_bridge.sampler.base import SamplingParams
from agl_bridge.sampler.hf import HFSampler
from agl_bridge.tinker_api.app import CLIENT_CONFIG, PROTOBUF
from agl_bridge.tinker_api.server import TinkerServer
from agl_bridge.tinker_api.wire import encode_forward_backward

PROMPT = "Let's play a game. Say you are 42."
BASE_MODEL = "Qwen/Qwen3-8B"
DATUM_TOKENS = 16
"""Part 2's forward_backward datum: 16 input tokens, 16 targets (the null server answers 16 logprobs)."""
WARMUP_CALLS = 5
HOLD_MS = 10
"""How long the holding null server keeps a forward_backward or sample result: longer than the ~4 ms
the SDK takes to send its poll, less than serve-tinker's compute for these calls."""
ADDRESS = re.compile(r"TINKER_BASE_URL=(\S+) TINKER_API_KEY=(\S+)")


def main() -> None:
    """Run the steps both ways and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--null-server", action="store_true", help="serve a null Tinker server (part 2)")
    parser.add_argument("--hold-ms", type=float, default=0.0, help="the null server's hold on each result")
    args = parser.parse_args()
    if args.null_server:
        serve_null(args.hold_ms / 1000)
        return

    root = Path(tempfile.mkdtemp(prefix="agl-tinker-bench-"))
    adam = dict(learning_rate=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0, grad_clip_norm=1.0)
    loss_gaps, ratio_gaps, wire_s, local_s = [], [], [], []
    with (
        TinkerServer(bind_socket("127.0.0.1", 0), root, models={"Qwen/Qwen3-8B": "tiny"}) as server,
        tinker.ServiceClient(base_url=server.base_url, api_key=server.api_key) as service,
    ):
        training = service.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=8, seed=0).result()
        local = TrainingClient("tiny", lora_rank=8, seed=0, train_unembedding=True)
        prompt = training.get_tokenizer().encode(PROMPT)
        for step in range(args.steps):
            sampler = training.save_weights_and_get_sampling_client().result()
            params = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=step)
            replies = sampler.sample(types.ModelInput.from_ints(prompt), args.group, params).result().sequences
            wire_data, local_data = [], []
            for index, reply in enumerate(replies):
                tokens = prompt + reply.tokens
                advantage = 1.0 if index % 2 == 0 else -1.0
                logprobs = [0.0] * (len(prompt) - 1) + list(reply.logprobs)
                advantages = [0.0] * (len(prompt) - 1) + [advantage] * len(reply.tokens)
                inputs = {"target_tokens": tokens[1:], "logprobs": logprobs, "advantages": advantages}
                wire_data.append(
                    types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)
                )
                weights = [0.0] * (len(prompt) - 1) + [1.0] * len(reply.tokens)
                local_data.append(Datum(tokens[:-1], {**inputs, "weights": weights}))

            started = time.perf_counter()
            wire = training.forward_backward(wire_data, "importance_sampling").result()
            training.optim_step(types.AdamParams(**adam)).result()
            wire_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            ours = local.forward_backward(local_data, "importance_sampling")
            local.optim_step(AdamParams(**adam))
            local_s.append(time.perf_counter() - started)

            loss_gaps.append(
                abs(wire.metrics["loss:sum"] - ours.metrics["loss"]) / max(abs(ours.metrics["loss"]), 1e-12)
            )
            for output, reply in zip(wire.loss_fn_outputs, replies, strict=True):
                trainer = output["logprobs"].to_numpy()[len(prompt) - 1 :]
                ratio_gaps.extend(abs(math.exp(t - s) - 1.0) for t, s in zip(trainer, reply.logprobs, strict=True))
        local.close()
    overhead = wire_overhead((prompt * DATUM_TOKENS)[: DATUM_TOKENS + 1], args.calls)
    print(
        json.dumps(
            {
                "steps": args.steps,
                "sequences_per_step": args.group,
                "loss_rel_diff_max": max(loss_gaps),
                "sampler_vs_trainer_ratio_minus_1_max": max(ratio_gaps),
                "sampler_vs_trainer_ratio_minus_1_p99": sorted(ratio_gaps)[int(0.99 * (len(ratio_gaps) - 1))],
                "tokens_over_1e-5": sum(gap > 1e-5 for gap in ratio_gaps),
                "tokens_compared": len(ratio_gaps),
                "step_s_wire_median": round(statistics.median(wire_s), 4),
                "step_s_in_process_median": round(statistics.median(local_s), 4),
                **overhead,
            }
        )
    )


def wire_overhead(tokens: list[int], calls: int) -> dict[str, float]:
    """Part 2: p50 milliseconds the wire adds to a small forward_backward and to a one-token sample,
    the SDK's floor (the same calls against a null server) and serve-tinker's share (the rest)."""
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )
    prompt = types.ModelInput.from_ints(tokens[:-1])
    one_token = types.SamplingParams(max_tokens=1, temperature=1.0)
    ours = [sys.executable, "-m", "agl_bridge", "serve-tinker", "--port", "0", "--device", "cpu"]
    ours += ["--model", f"{BASE_MODEL}=tiny", "--root", tempfile.mkdtemp(prefix="agl-tinker-bench-")]
    null = [sys.executable, str(Path(__file__).resolve()), "--null-server"]
    servers = {"ours": ours, "instant": null, "held": [*null, "--hold-ms", str(HOLD_MS)]}
    with contextlib.ExitStack() as stack:  # unwinds in reverse: clients closed, then servers stopped
        local = stack.enter_context(HFSampler.from_pretrained("tiny", device="cpu"))
        addresses = stack.enter_context(server_processes(*servers.values()))
        clients = {}
        for name, (base_url, api_key) in zip(servers, addresses, strict=True):
            service = stack.enter_context(tinker.ServiceClient(base_url=base_url, api_key=api_key))
            training = service.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=0).result()
            clients[name] = training, service.create_sampling_client(base_model=BASE_MODEL).result()
        walls: dict[str, list[float]] = {f"{call}_{name}": [] for call in ("fb", "sample") for name in servers}
        fb_compute, local_s = [], []
        for call in range(WARMUP_CALLS + calls):
            keep = call >= WARMUP_CALLS
            for name, (training, sampler) in clients.items():  # interleaved: drift hits every server alike
                started = time.perf_counter()
                result = training.forward_backward([datum], "cross_entropy").result()
                if keep:
                    walls[f"fb_{name}"].append(time.perf_counter() - started)
                    if name == "ours":
                        fb_compute.append(result.metrics["time_s:max"])
                started = time.perf_counter()
                sampler.sample(prompt, 1, one_token).result()
                if keep:
                    walls[f"sample_{name}"].append(time.perf_counter() - started)
            started = time.perf_counter()
            local.sample(tokens[:-1], SamplingParams(max_tokens=1))
            if keep:
                local_s.append(time.perf_counter() - started)

    def ms(seconds: float) -> float:
        return round(1000 * seconds, 2)

    p50 = {key: statistics.median(values) for key, values in walls.items()}
    overhead = {
        "fb": statistics.median(wall - compute for wall, compute in zip(walls["fb_ours"], fb_compute, strict=True)),
        "sample": p50["sample_ours"] - statistics.median(local_s),
    }
    figures = {}
    for call, label in (("fb", "forward_backward"), ("sample", "sample")):
        floor = p50[f"{call}_held"] - HOLD_MS / 1000
        figures[f"{label}_overhead_ms_p50"] = ms(overhead[call])
        figures[f"{label}_sdk_floor_ms_p50"] = ms(floor)
        figures[f"{label}_server_share_ms_p50"] = ms(overhead[call] - floor)
        figures[f"{label}_sdk_ms_p50_instant_server"] = ms(p50[f"{call}_instant"])
        figures[f"{label}_ms_p50_sdk"] = ms(p50[f"{call}_ours"])
    return {
        **figures,
        "forward_backward_compute_ms_p50": ms(statistics.median(fb_compute)),
        "sample_ms_p50_in_process": ms(statistics.median(local_s)),
    }


@contextlib.contextmanager
def server_processes(*commands: list[str]) -> Iterator[list[tuple[str, str]]]:
    """Start Tinker server `commands` side by side, each printing `TINKER_BASE_URL=... TINKER_API_KEY=...`
    on stderr; yields their (base URL, key) and stops each by its PID (SIGINT, then wait) on the way out."""
    processes: list[subprocess.Popen[str]] = []
    try:
        for command in commands:
            processes.append(subprocess.Popen(command, stderr=subprocess.PIPE, text=True))
        yield [_address(process) for process in processes]
    finally:
        for process in processes:
            process.send_signal(signal.SIGINT)  # a no-op for one that has already exited
        for process in processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _address(process: subprocess.Popen[str]) -> tuple[str, str]:
    assert process.stderr is not None
    seen = []
    for line in process.stderr:
        if found := ADDRESS.search(line):
            # Keep reading its stderr, so that a full pipe never blocks it; pass on what it says.
            threading.Thread(target=shutil.copyfileobj, args=(process.stderr, sys.stderr), daemon=True).start()
            return found[1], found[2]
        seen.append(line)
    raise RuntimeError(f"{process.args!r} exited before printing its address:\n{''.join(seen)}")


def serve_null(hold_s: float) -> None:
    """A Tinker server that does no work: every route a LoRA training client and a base-model sampling
    client need, answered with canned results; `retrieve_future` returns a forward_backward or sample
    result `hold_s` after the call arrived (at once when 0), others at once. Served like
    `agl-bridge serve-tinker` (uvicorn on a bound socket, warnings only, no access log, no lifespan)."""
    sock = bind_socket("127.0.0.1", 0)
    forward_backward_result = encode_forward_backward([[0.0] * DATUM_TOKENS], {"loss": 0.0})
    one_token = pb.SampledSequence(
        stop_reason=pb.STOP_REASON_LENGTH,
        tokens=np.zeros(1, dtype="<i4").tobytes(),
        logprobs=np.zeros(1, dtype="<f4").tobytes(),
    )
    model_id = "null-session:train:0"
    info = {
        "model_id": model_id,
        "model_data": {"model_name": BASE_MODEL, "tokenizer_id": "tiny", "arch": "qwen3"},
        "model_name": BASE_MODEL,
        "is_lora": True,
        "lora_rank": 8,
        "optimizer_config": {"type": "adamw"},
    }
    results: dict[str, tuple[float, Response]] = {}  # request_id → (when it is ready, what retrieve_future answers)
    ids = itertools.count()

    def future(result: Response, hold: float = 0.0, samples: int | None = None, **extra: Any) -> JSONResponse:
        request_id = f"null-{next(ids)}"
        results[request_id] = time.perf_counter() + hold, result
        if samples is not None:
            extra["sample_sequence_ids"] = [f"{request_id}:{index}" for index in range(samples)]
        return JSONResponse({"request_id": request_id, **extra})

    def answer(content: Any) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            await request.body()
            return JSONResponse(content)

        return endpoint

    async def create_model(request: Request) -> Response:
        await request.body()
        return future(JSONResponse({"model_id": model_id}))

    async def forward_backward(request: Request) -> Response:
        await request.body()
        return future(Response(forward_backward_result, media_type=PROTOBUF), hold_s, model_id=model_id)

    async def asample(request: Request) -> Response:
        count = (await request.json())["num_samples"]
        result = pb.SampleResponse(sequences=[one_token] * count).SerializeToString()
        return future(Response(result, media_type=PROTOBUF), hold_s, samples=count)

    async def retrieve_future(request: Request) -> Response:
        ready, result = results.pop((await request.json())["request_id"])
        await asyncio.sleep(ready - time.perf_counter())  # returns at once when it is due already
        return result

    routes = [
        ("/client/config", answer(CLIENT_CONFIG)),
        ("/client/dynamic_config", answer({})),
        ("/create_session", answer({"session_id": "null-session"})),
        ("/session_heartbeat", answer({})),
        ("/telemetry", answer({"status": "accepted"})),
        ("/sessions/{session_id}/finish", answer({})),
        ("/create_model", create_model),
        ("/get_info", answer(info)),
        ("/forward_backward", forward_backward),
        ("/create_sampling_session", answer({"sampling_session_id": "null-session:sample:0"})),
        ("/asample", asample),
        ("/retrieve_future", retrieve_future),
    ]
    app = Starlette(routes=[Route(f"/api/v1{path}", handler, methods=["POST"]) for path, handler in routes])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    host, port = sock.getsockname()[:2]
    print(f"null Tinker server: TINKER_BASE_URL=http://{host}:{port} TINKER_API_KEY=tml-null", file=sys.stderr)
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])


if __name__ == "__main__":
    main()
