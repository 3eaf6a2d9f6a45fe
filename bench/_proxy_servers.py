"""The processes `bench/proxy.py` starts: the proxies it times over HTTP, and the in-process timing.

LiteLLM's proxy keeps its state in module globals, so every proxy variant runs in a process of its
own (`python bench/proxy.py --serve bare|bare_fixed|traced|hf --port N --key K`; port 0, the default, picks
a free one), and the in-process measurement (a) runs in one too (`--inprocess`), so the
benchmark's own process never imports LiteLLM. Every server prints `READY <port>` on stdout once it
answers, and stops on SIGTERM.

bare:   LiteLLM's proxy app over the InstantSampler through a minimal `CustomLLM` (chat template,
        sample, detokenize; no store, gateway or routes of ours), configured like ours
        (`litellm_config`) and served by uvicorn with the same settings: the baseline.
bare_fixed: the same with a `CustomLLM` that returns a fixed text (no tokenizer).
traced: `ProxyServer` (gateway, our routes and callbacks, chat-template encoding, durable
        recording into a SQLite store) over an `InstantSampler`.
hf:     `ProxyServer` over the sampler `agl-bridge serve` builds with the tiny model (`HFProcessSampler`;
        `HFSampler` in the server's process with `--in-process-sampler`), for throughput.
"""

from __future__ import annotations

import os

# Before anything imports LiteLLM or transformers.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ.setdefault("LITELLM_LOG", "CRITICAL")  # what agl_bridge.proxy sets; the same for both proxies
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import asyncio
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

INSTANT_MODEL = "instant"
_BARE_PROVIDER = "bare"  # the baseline CustomLLM's provider name in the in-process measurement
INSTANT_TEXT = "I'm here."
MESSAGES = [{"role": "user", "content": "hi"}]


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))  # ceil(n * p / 100), at least 1
    return ordered[int(rank) - 1]


def latency_summary(ms: list[float]) -> dict[str, float]:
    """p50 / p99 / mean of latencies in milliseconds, rounded for printing."""
    return {
        "p50_ms": round(statistics.median(ms), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "mean_ms": round(statistics.fmean(ms), 3),
        "n": len(ms),
    }


def _instant_sampler(tokenizer: Any, codec: Any) -> Any:
    """An InstantSampler answering "I'm here." followed by the model's end-of-turn token."""
    from agl_bridge.sampler.instant import InstantSampler

    ids = list(tokenizer(INSTANT_TEXT, add_special_tokens=False)["input_ids"]) + [codec.stop_token_ids[0]]
    return InstantSampler(ids, vocab_size=len(tokenizer))


def _instant_custom_llm() -> Any:
    """The fixed-text baseline's provider: a CustomLLM that fills in a fixed answer and nothing else."""
    from litellm import CustomLLM
    from litellm.types.utils import Choices, Message, ModelResponse, Usage

    class InstantLLM(CustomLLM):
        async def acompletion(
            self,
            model: str,
            messages: list,
            api_base: Any,
            custom_prompt_dict: Any,
            model_response: ModelResponse,
            print_verbose: Any,
            encoding: Any,
            api_key: Any,
            logging_obj: Any,
            optional_params: dict,
            acompletion: Any = None,
            litellm_params: dict | None = None,
            logger_fn: Any = None,
            headers: Any = None,
            timeout: Any = None,
            client: Any = None,
        ) -> ModelResponse:
            model_response.choices = [
                Choices(index=0, message=Message(content=INSTANT_TEXT, role="assistant"), finish_reason="stop")
            ]
            model_response.model = model
            model_response.usage = Usage(prompt_tokens=9, completion_tokens=5, total_tokens=14)
            return model_response

    return InstantLLM()


def _sampler_custom_llm() -> Any:
    """The baseline's provider: the InstantSampler behind a minimal CustomLLM, with no tracing or store.

    It does what any provider over a token sampler must: render the chat template and tokenize
    (`ChatCodec.encode_prompt`), sample, detokenize (`ChatCodec.decode_response`), and report usage.
    None of ours: no gateway, rollout routing, request validation, recording or spans.
    """
    from litellm import CustomLLM
    from litellm.types.utils import Choices, Message, ModelResponse, Usage

    from agl_bridge.chat import ChatCodec
    from agl_bridge.models.loading import load_tokenizer
    from agl_bridge.sampler.base import SamplingParams

    codec = ChatCodec(load_tokenizer("tiny"))
    sampler = _instant_sampler(codec.tokenizer, codec)

    class SamplerLLM(CustomLLM):
        async def acompletion(
            self,
            model: str,
            messages: list,
            api_base: Any,
            custom_prompt_dict: Any,
            model_response: ModelResponse,
            print_verbose: Any,
            encoding: Any,
            api_key: Any,
            logging_obj: Any,
            optional_params: dict,
            acompletion: Any = None,
            litellm_params: dict | None = None,
            logger_fn: Any = None,
            headers: Any = None,
            timeout: Any = None,
            client: Any = None,
        ) -> ModelResponse:
            prompt = codec.encode_prompt(messages)
            params = SamplingParams(max_tokens=optional_params.get("max_tokens"))
            sequence = (await sampler.sample_async(prompt.token_ids, params)).sequences[0]
            message = codec.decode_response(sequence.tokens, sequence.stop_reason)
            model_response.choices = [
                Choices(
                    index=0,
                    message=Message(content=message.content, role="assistant"),
                    finish_reason=message.finish_reason,
                )
            ]
            model_response.model = model
            prompt_tokens, completion_tokens = len(prompt.token_ids), len(sequence.tokens)
            model_response.usage = Usage(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                total_tokens=prompt_tokens + completion_tokens,
            )
            return model_response

    return SamplerLLM()


# ------------------------------------------------------------------------------------ servers


def _profiled(run: Any, profile_path: str | None) -> None:
    """Call `run()`; with a path, cProfile the main thread (the event loop) from SIGUSR1 until exit.

    Profiling starts on the signal, not at start-up, so that imports and start-up do not drown
    the per-request costs; the stats are written to `profile_path` when the server stops. Times
    are the thread's CPU time (`time.thread_time`), so other processes' load does not count.
    """
    if not profile_path:
        run()
        return
    import cProfile

    profiler = cProfile.Profile(time.thread_time)
    signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())
    try:
        run()
    finally:
        profiler.disable()
        profiler.dump_stats(profile_path)


def serve_bare(port: int, api_key: str, profile_path: str | None = None, *, fixed_text: bool = False) -> None:
    """LiteLLM's proxy over the InstantSampler (or, `fixed_text`, a fixed answer), configured and
    served like ProxyServer does."""
    import litellm
    import uvicorn
    import yaml
    from litellm.utils import custom_llm_setup

    from agl_bridge.proxy.provider import PROVIDER_NAME
    from agl_bridge.proxy.server import bind_socket, litellm_config

    sock = bind_socket("127.0.0.1", port)
    handler = _instant_custom_llm() if fixed_text else _sampler_custom_llm()
    litellm.custom_provider_map = [{"provider": PROVIDER_NAME, "custom_handler": handler}]
    custom_llm_setup()
    config_dir = tempfile.mkdtemp(prefix="agl-bench-bare-")
    config_path = Path(config_dir) / "litellm_config.yaml"
    config_path.write_text(yaml.safe_dump(litellm_config([INSTANT_MODEL], api_key)))
    os.environ["CONFIG_FILE_PATH"] = str(config_path)
    from litellm.proxy import proxy_server

    config = uvicorn.Config(
        proxy_server.app,
        loop="asyncio",
        lifespan="on",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=75,  # as ProxyServer: pooled client connections outlive a pause in the benchmark
    )
    server = uvicorn.Server(config)

    async def main() -> None:
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.02)
        print(f"READY {sock.getsockname()[1]}", flush=True)
        await serving

    try:
        _profiled(lambda: asyncio.run(main()), profile_path)
    finally:
        import shutil

        shutil.rmtree(config_dir, ignore_errors=True)


def serve_traced(
    port: int,
    api_key: str,
    sampler_kind: str,
    profile_path: str | None = None,
    threads: int | None = None,
    in_process_sampler: bool = False,
) -> None:
    """ProxyServer over an InstantSampler ("instant") or the tiny model's hf sampler ("hf").

    The hf sampler is the one `agl-bridge serve` builds (`build_sampler`): in a child process, or in
    this one with `in_process_sampler`; `threads` sets its torch intra-op threads (default: serve's).
    """
    from agl_bridge.chat import ChatCodec
    from agl_bridge.models.loading import load_tokenizer, resolve_model_path
    from agl_bridge.proxy.server import ProxyServer

    tokenizer = load_tokenizer("tiny")
    ready = "READY {port}"
    if sampler_kind == "instant":
        sampler: Any = _instant_sampler(tokenizer, ChatCodec(tokenizer))
        name = INSTANT_MODEL
    else:
        import torch

        from agl_bridge.sampler.factory import SamplerSpec, build_sampler
        from agl_bridge.sampler.hf import serving_torch_threads

        torch.set_num_threads(threads or serving_torch_threads())  # as `agl-bridge serve` does
        spec = SamplerSpec(seed=0, process=not in_process_sampler)
        sampler = build_sampler(spec, str(resolve_model_path("tiny")), tokenizer, served_name="tiny")
        name = "tiny"
        ready += f" torch_threads={torch.get_num_threads()} sampler={type(sampler).__name__}"
    with tempfile.TemporaryDirectory(prefix="agl-bench-proxy-") as directory:
        server = ProxyServer(
            sampler=sampler,
            tokenizer=tokenizer,
            store_path=Path(directory) / "calls.sqlite",
            model_name=name,
            port=port,
            api_key=api_key,
        )
        try:
            line = ready.format(port=server.port)
            _profiled(lambda: server.serve_forever(on_ready=lambda _: print(line, flush=True)), profile_path)
        finally:
            if hasattr(sampler, "close"):
                sampler.close()


# ------------------------------------------------------------------------- (a) in-process


async def _inprocess(requests: int, warmup: int) -> dict[str, Any]:
    import litellm
    from litellm.utils import custom_llm_setup

    from agl_bridge.chat import ChatCodec
    from agl_bridge.models.loading import load_tokenizer
    from agl_bridge.proxy.provider import PROVIDER_NAME, AglProvider
    from agl_bridge.proxy.recording import CallRecorder
    from agl_bridge.proxy.request import RolloutRoute
    from agl_bridge.proxy.service import ChatService
    from agl_bridge.store import SQLiteStore

    tokenizer = load_tokenizer("tiny")
    codec = ChatCodec(tokenizer)
    with tempfile.TemporaryDirectory(prefix="agl-bench-inproc-") as directory:
        async with SQLiteStore(Path(directory) / "calls.sqlite") as store:
            service = ChatService(
                sampler=_instant_sampler(tokenizer, codec),
                codec=codec,
                recorder=CallRecorder(store),
                model_name=INSTANT_MODEL,
            )
            provider = AglProvider()
            provider.register(service)
            litellm.custom_provider_map = [
                {"provider": PROVIDER_NAME, "custom_handler": provider},
                {"provider": _BARE_PROVIDER, "custom_handler": _sampler_custom_llm()},
            ]
            custom_llm_setup()
            route = RolloutRoute()

            async def ours() -> None:
                response = await litellm.acompletion(
                    model=f"{PROVIDER_NAME}/{INSTANT_MODEL}", messages=MESSAGES, max_tokens=16
                )
                assert response.choices[0].message.content == INSTANT_TEXT, response

            async def bare() -> None:  # the baseline's CustomLLM through the same LiteLLM call
                response = await litellm.acompletion(
                    model=f"{_BARE_PROVIDER}/{INSTANT_MODEL}", messages=MESSAGES, max_tokens=16
                )
                assert response.choices[0].message.content == INSTANT_TEXT, response

            async def service_only() -> None:  # our work without LiteLLM: parse, encode, sample, record
                await service.complete(service.parse_request({"messages": MESSAGES, "max_tokens": 16}), route)

            calls = {"acompletion": ours, "acompletion_bare_provider": bare, "service_complete": service_only}
            timings: dict[str, list[float]] = {name: [] for name in calls}
            for _ in range(warmup):
                for fn in calls.values():
                    await fn()
                    await _settle()
            for _ in range(requests):  # interleaved, so that background load hits all three alike
                for name, fn in calls.items():
                    t0 = time.perf_counter()
                    await fn()
                    timings[name].append((time.perf_counter() - t0) * 1e3)
                    await _settle()
            stored = store.write_stats["ops"]
    out: dict[str, Any] = {name: latency_summary(values) for name, values in timings.items()}
    out["provider_overhead_p50_ms"] = round(
        out["acompletion"]["p50_ms"] - out["acompletion_bare_provider"]["p50_ms"], 3
    )
    out["calls_stored"] = stored
    return out


_IDLE_LOOPS = ("LoggingWorker._worker_loop", "GroupCommitter._run")  # wait for work forever


async def _settle(max_wait_s: float = 0.5) -> None:
    """Let the work LiteLLM leaves behind a call (success logging, run by its logging worker) finish
    before the next call is timed, so that it is not billed to whichever call comes next."""
    from litellm.litellm_core_utils.logging_worker import GLOBAL_LOGGING_WORKER

    me = asyncio.current_task()
    deadline = time.perf_counter() + max_wait_s
    while time.perf_counter() < deadline:
        queue = getattr(GLOBAL_LOGGING_WORKER, "_queue", None)
        busy = [
            t
            for t in asyncio.all_tasks()
            if t is not me and not t.done() and getattr(t.get_coro(), "__qualname__", "") not in _IDLE_LOOPS
        ]
        if not busy and (queue is None or queue.empty()):
            return
        await asyncio.sleep(0)


def run_inprocess(requests: int, warmup: int) -> None:
    """Measurement (a); prints one JSON object on stdout."""
    print(json.dumps(asyncio.run(_inprocess(requests, warmup))), flush=True)


def _die_with_parent() -> None:
    """Have the kernel kill this process if the benchmark that started it dies (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before the call above
        os._exit(1)


def main(argv: list[str]) -> None:
    """`--serve bare|traced|hf --port N --key K [--profile PATH] [--threads N] [--in-process-sampler]`, or
    `--inprocess --requests N --warmup N`."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", choices=["bare", "bare_fixed", "traced", "hf"])
    parser.add_argument("--inprocess", action="store_true")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--key", default="sk-agl-bench")
    parser.add_argument("--profile", default=None, help="dump cProfile stats of the server here on exit")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads of the hf server")
    parser.add_argument("--in-process-sampler", action="store_true", help="hf server: the sampler in its process")
    args = parser.parse_args(argv)
    _die_with_parent()
    if args.inprocess:
        run_inprocess(args.requests, args.warmup)
        return
    # uvicorn handles SIGTERM while serving (graceful shutdown, then the store is flushed and closed)
    # and re-raises it once it has stopped: ignore that second delivery so the process ends normally
    # (and a profile gets written). Before uvicorn serves, the benchmark's SIGKILL fallback applies.
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        if args.serve in ("bare", "bare_fixed"):
            serve_bare(args.port, args.key, args.profile, fixed_text=args.serve == "bare_fixed")
        else:
            kind = "instant" if args.serve == "traced" else "hf"
            serve_traced(args.port, args.key, kind, args.profile, args.threads, args.in_process_sampler)
    except KeyboardInterrupt:
        pass
