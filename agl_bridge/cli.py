"""The ``agl-bridge`` command line: a thin layer over library functions, one command per job.

Commands translate user mistakes into one clear message and exit code 2 (typer.BadParameter,
or `_fail` for the store commands: one "Error: ..." line on stderr, no usage box);
the work itself lives in the library so it can be called and tested without the CLI.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import json
import math
import os
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from agl_bridge.convert.export import TrajectoryExportCounts
from agl_bridge.convert.records import in_class_order
from agl_bridge.export import EXPORTERS, ExportWhat
from agl_bridge.export_files import ExportCounts, ExportFormat, ExportOutputError
from agl_bridge.models.families import FAMILIES
from agl_bridge.models.tiny import InvalidTinySpecError, TinyModelSpec, build_tiny
from agl_bridge.quick_exit import skip_final_collection
from agl_bridge.sampler.factory import SamplerSpec, SamplerSpecError
from agl_bridge.store.errors import RolloutNotFoundError, StoreError, StoreSchemaError
from agl_bridge.store.export import NoStoreError, open_existing_store
from agl_bridge.store.location import describe_location, is_postgres_location

if TYPE_CHECKING:
    from rich.console import RenderableType

    from agl_bridge.train.config import GRPOConfig

app = typer.Typer(
    name="agl-bridge",
    help="Turn agent code into exact-token RL training data and train on it with GRPO.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def main() -> None:
    """Turn agent code into exact-token RL training data and train on it with GRPO."""
    # A callback keeps `agl-bridge <command>` a command group even while it has only one command.
    skip_final_collection()


@app.command("tiny-model")
def tiny_model(
    out_dir: Path = typer.Argument(
        ..., metavar="OUT_DIR", help="Directory to write into (created; must be empty or a previous tiny build)."
    ),
    hidden: int = typer.Option(TinyModelSpec.hidden, help="Hidden size; a multiple of 8 (head_dim = hidden/4)."),
    layers: int = typer.Option(TinyModelSpec.layers, help="Number of transformer layers (>= 1)."),
    vocab: int = typer.Option(TinyModelSpec.vocab, help="Tokenizer size, special and added tokens included."),
    seed: int = typer.Option(TinyModelSpec.seed, help="Seed of the random weights."),
    initializer_range: float = typer.Option(TinyModelSpec.initializer_range, help="Std of the random weights."),
    family: str = typer.Option(
        TinyModelSpec.family, help=f"Architecture: {', '.join(FAMILIES)} (same tokenizer and chat template)."
    ),
    context: int = typer.Option(TinyModelSpec.context, help="Context window in tokens (max_position_embeddings)."),
) -> None:
    """Build the offline tiny test model (byte-level BPE tokenizer + a random model, Qwen3 by default) into OUT_DIR."""
    spec = TinyModelSpec(
        hidden=hidden,
        layers=layers,
        vocab=vocab,
        seed=seed,
        initializer_range=initializer_range,
        family=family,
        context=context,
    )
    started = time.perf_counter()
    try:
        info = build_tiny(out_dir, spec)
    except InvalidTinySpecError as exc:
        raise typer.BadParameter(str(exc), param_hint=f"--{exc.field.replace('_', '-')}") from None
    except FileExistsError as exc:
        raise typer.BadParameter(str(exc), param_hint="OUT_DIR") from None
    elapsed = time.perf_counter() - started
    typer.echo(f"Wrote tiny model to {info.path.resolve()} in {elapsed:.1f}s")
    typer.echo(
        f"  {spec.family}, vocab {info.vocab_size}, hidden {spec.hidden}, layers {spec.layers}, seed {spec.seed}: "
        f"{info.num_parameters:,} parameters, {info.bytes_on_disk / 1e6:.1f} MB on disk"
    )
    typer.echo(f"  eos <|im_end|> = {info.eos_token_id}, pad <|endoftext|> = {info.pad_token_id}")


@app.command("demo")
def demo(
    model: str = typer.Option("tiny", help="`tiny`, a local model directory, or a hub id."),
    conversations: int = typer.Option(8, min=1, max=64, help="Concurrent two-turn conversations."),
    max_tokens: int = typer.Option(24, min=1, help="Most tokens per reply."),
    seed: int = typer.Option(0, help="Sampling seed."),
) -> None:
    """Sample concurrent chats on the tiny model and show exact token ids, logprobs and turn extension."""
    from agl_bridge.models.loading import ModelNotFoundError
    from agl_bridge.sampling_demo import run_sampling_demo

    try:
        reports = run_sampling_demo(model, conversations=conversations, max_tokens=max_tokens, seed=seed)
    except ModelNotFoundError as exc:
        raise typer.BadParameter(str(exc), param_hint="--model") from None
    if not all(r.second_prompt_extends for r in reports):
        raise typer.Exit(1)


def _fail(message: str, code: int = 2) -> NoReturn:
    """Print one error line (no usage box, no traceback) and exit with `code`."""
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(code)


def _store_failure(exc: StoreError | ExportOutputError, store: str | Path) -> NoReturn:
    """Turn a store error of a read-only command (or an unwritable export file) into one line and an exit code."""
    if isinstance(exc, RolloutNotFoundError):
        again = "URL" if is_postgres_location(store) else store  # a URL may hold a password: never echoed
        _fail(
            f"no rollout {exc.rollout_id!r} in {describe_location(store)}; "
            f"list its rollouts with `agl-bridge inspect --store {again}`"
        )
    if isinstance(exc, (NoStoreError, StoreSchemaError, ExportOutputError)):
        _fail(str(exc))
    _fail(str(exc), code=1)  # not a usage mistake (a locked or unreadable file): exit 1


WORKER_STOP_S = 20.0
"""How long `serve --workers` gives its workers to stop (finish requests, close the store) before killing them."""
STORE_ENV = "AGL_STORE"
"""Environment variable naming the store (a SQLite file or a postgresql:// URL) when --store is not given."""
_STORE_HELP = (
    "The store the proxy or runner records into: a SQLite file, or a PostgreSQL URL "
    f"(postgresql://user:password@host:port/db); it must exist. Default: ${STORE_ENV}."
)


_EXPORT_HELP = (
    "Export LLM calls and rewards (--what calls), or training trajectories (--what trajectories), streamed.\n\n"
    'calls: JSON Lines, each line one record, "kind": "llm_call" or "kind": "reward". Order: records made '
    "outside any rollout first, then by rollout id, attempt id and sequence, with rewards interleaved among "
    "the calls by sequence. Floats round-trip exactly through Python's json (a -inf logprob is written "
    "-Infinity).\n\n"
    "trajectories: one record per succeeded attempt of a finished rollout (token ids, loss mask, sampler "
    "logprobs, policy versions, rewards), as JSON Lines or Parquet (--format); read them back with "
    "agl_bridge.convert.read_trajectories. Schema and rules: docs/trajectories.md."
)

_TRAJECTORY_ONLY = "(trajectories only)"


def _reward_weights(values: list[str]) -> dict[str, float]:
    """Parse repeated `--reward-weight NAME=WEIGHT` options, failing with one line on a bad one."""
    weights: dict[str, float] = {}
    for value in values:
        name, sep, number = value.partition("=")
        try:
            weight = float(number)
        except ValueError:
            weight = math.nan
        if not sep or not name or not math.isfinite(weight):
            _fail(
                f"--reward-weight {value!r} is not NAME=WEIGHT with a finite number, e.g. --reward-weight correct=1.0"
            )
        weights[name] = weight
    return weights


def _export_summary(what: ExportWhat, counts: ExportCounts, scope: str, out: Path) -> str:
    """The line `export` prints once the file is written."""
    if what is ExportWhat.CALLS or not isinstance(counts, TrajectoryExportCounts):
        return f"Wrote {counts.calls} LLM calls and {counts.rewards} rewards{scope} to {out.resolve()}"
    report = counts.report
    line = (
        f"Wrote {counts.trajectories} trajectories ({report.segments} segments from {report.calls_trained} "
        f"LLM calls){scope} to {out.resolve()}"
    )
    if report.dropped:
        line += "; attempts dropped: " + ", ".join(f"{reason} {n}" for reason, n in sorted(report.dropped.items()))
    if report.splits:
        line += "; splits: " + ", ".join(f"{kind} {n}" for kind, n in sorted(report.splits.items()))
    if report.excluded_by_class:
        excluded = in_class_order(report.excluded_by_class)
        line += "; not trained, by class: " + ", ".join(f"{name} {n}" for name, n in excluded)
    return line


def _check_writable_store(store: Path) -> None:
    """Fail with one line if the store file cannot be created or written where it was asked for."""
    folder = store.resolve().parent
    if not folder.is_dir():
        _fail(f"the store's folder {folder} does not exist; create it or pass --store PATH in an existing folder")
    if store.exists() and not os.access(store, os.W_OK) or not store.exists() and not os.access(folder, os.W_OK):
        _fail(f"cannot write the store at {store.resolve()} (read-only location); pass --store PATH somewhere writable")


_SPEC_OPTION = "sampler_option_"


def with_sampler_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give `command` one option per `SamplerSpec` setting that has a flag, and call it with the spec they make.

    The options' flags, help and defaults are the spec's (`SamplerSetting`), so a setting added to
    the spec with a flag appears here; `command` takes the spec as its keyword-only `spec` parameter.
    """
    hints = typing.get_type_hints(SamplerSpec)
    defaults = SamplerSpec()
    flags = {name: setting for name, setting in SamplerSpec.settings().items() if setting.flag is not None}
    options = [
        inspect.Parameter(
            _SPEC_OPTION + name,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=typer.Option(
                getattr(defaults, name),
                _declaration(str(setting.flag), hints[name]),
                metavar=setting.metavar,
                help=setting.help,
            ),
            annotation=hints[name],
        )
        for name, setting in flags.items()
    ]

    @functools.wraps(command)
    def with_spec(**values: Any) -> None:
        settings = {name: values.pop(_SPEC_OPTION + name) for name in flags}
        command(**values, spec=SamplerSpec(**settings))

    signature = inspect.signature(command, eval_str=True)
    kept = [p for p in signature.parameters.values() if p.name != "spec"]
    with_spec.__signature__ = signature.replace(parameters=[*kept, *options])  # type: ignore[attr-defined]
    return with_spec


def _declaration(flag: str, annotation: Any) -> str:
    """The option's declaration: a switch pair (`--x/--no-x`) for a yes/no setting that may be left unsaid."""
    return f"{flag}/--no-{flag.removeprefix('--')}" if annotation == bool | None else flag


@app.command("serve")
@with_sampler_options
def serve_command(
    model: str = typer.Option("tiny", help="`tiny`, a local model directory, or a hub id."),
    store: str = typer.Option(
        "agl_store.sqlite",
        "--store",
        envvar=STORE_ENV,
        metavar="PATH|URL",
        help="SQLite file to record into (created if missing), or a PostgreSQL database (postgresql://user@host/db: "
        "several serve processes may share one; see docs/scaling.md).",
    ),
    host: str = typer.Option("127.0.0.1", help="Address to bind; anything but loopback needs --api-key."),
    port: int = typer.Option(4000, min=0, max=65535, help="Port to listen on (0 picks a free one)."),
    api_key: str | None = typer.Option(
        None, envvar="AGL_API_KEY", help="Key clients must send; generated and printed if not given."
    ),
    litellm_config: Path | None = typer.Option(
        None,
        "--litellm-config",
        metavar="FILE",
        help="LiteLLM config whose model_list adds other models (recorded as text-only calls).",
    ),
    served_name: str | None = typer.Option(
        None, "--served-model-name", help="Model name clients ask for (default: tiny, or the model directory's name)."
    ),
    default_max_tokens: int = typer.Option(1024, min=1, help="max_tokens for requests that do not set it."),
    rollout_idle_timeout: float | None = typer.Option(
        None,
        "--rollout-idle-timeout",
        metavar="S",
        help="Time out a rollout started by an outside client after S seconds without a call, reward or "
        "request: its attempt ends timed_out and never trains (default: rollouts wait to be finished).",
    ),
    max_request_mb: float | None = typer.Option(
        None,
        "--max-request-mb",
        min=0.001,
        metavar="MB",
        help="Largest request body accepted (413 above it); default: what the largest prompt that fits the "
        "model's context window could need, at least 4 MiB.",
    ),
    torch_threads: int | None = typer.Option(
        None,
        "--torch-threads",
        min=1,
        metavar="N",
        help="Torch intra-op threads of the hf sampler (default: one per core but one, which is left to the HTTP "
        "server).",
    ),
    log_requests: bool = typer.Option(
        True,
        "--log-requests/--no-log-requests",
        help="One line per request on stderr: method, path, rollout, status, tokens, latency (never the key or "
        "message content).",
    ),
    workers: int = typer.Option(
        1,
        "--workers",
        min=1,
        metavar="N",
        help="Run N proxy processes on one port (SO_REUSEPORT: the kernel spreads connections) for a remote "
        "sampler; a rollout's turns may land on any of them. Needs --sampler remote (the in-process hf sampler "
        "stays one process); best with a PostgreSQL --store.",
    ),
    adapter_dir: Path | None = typer.Option(
        None,
        "--adapter-dir",
        metavar="DIR",
        help="Load LoRA adapters (POST /v1/load_lora_adapter, operator key) only from inside DIR: no other path, "
        "no '..', no symlink out of it (default: any path the server can read).",
    ),
    litellm_admin_routes: bool = typer.Option(
        False,
        "--litellm-admin-routes",
        help="Open LiteLLM's management, debug, SSO, spend and upstream-health routes to the operator key (off: 404 "
        "for every key; agent keys never reach them).",
    ),
    *,
    spec: SamplerSpec,
) -> None:
    """Serve the model behind the LiteLLM proxy, recording every call with exact token ids."""
    from agl_bridge.models.loading import served_model_name
    from agl_bridge.proxy.server import ProxyStartError, bind_socket, choose_api_key
    from agl_bridge.proxy.server import litellm_config as litellm_config_dict

    name = served_name or served_model_name(model)
    try:
        spec.validate()
    except SamplerSpecError as exc:
        _fail(f"{exc.flag}: {exc}")
    if workers > 1 and spec.kind != "remote":
        _fail(
            f"--workers {workers} runs {workers} proxy processes, but --sampler {spec.kind} samples inside the "
            "proxy's own process (it holds the model) and stays single-process: use --sampler remote "
            "--sampler-url URL (vLLM servers or another agl-bridge serve) with --workers, or leave --workers at 1"
        )
    if not is_postgres_location(store):
        _check_writable_store(Path(store))
    if rollout_idle_timeout is not None and not (math.isfinite(rollout_idle_timeout) and rollout_idle_timeout > 0):
        _fail(f"--rollout-idle-timeout must be a number of seconds > 0, got {rollout_idle_timeout}")
    try:  # refuse a public bind without a key, a taken port or a bad LiteLLM config before the (slow) model load
        choose_api_key(host, api_key)
        bind_socket(host, port, reuse_port=workers > 1).close()
        if litellm_config is not None:
            litellm_config_dict([name], "check", litellm_config)
    except ProxyStartError as exc:
        _fail(str(exc))
    settings = _ServeSettings(
        model=model,
        name=name,
        spec=spec,
        store=store,
        host=host,
        port=port,
        api_key=api_key,
        litellm_config=litellm_config,
        default_max_tokens=default_max_tokens,
        rollout_idle_timeout=rollout_idle_timeout,
        torch_threads=torch_threads,
        max_request_bytes=None if max_request_mb is None else int(max_request_mb * 1024 * 1024),
        log_requests=log_requests,
        adapter_dir=adapter_dir,
        litellm_admin_routes=litellm_admin_routes,
    )
    if workers > 1:
        _serve_workers(settings, workers)
    else:
        _serve_one(
            settings, lambda ready, path: _announce(settings, path, ready.base_url, ready.api_key, ready.generated_key)
        )


@dataclass(frozen=True)
class _ServeSettings:
    """What one `serve` process needs to build its proxy (picklable: `--workers` sends it to each worker)."""

    model: str
    name: str
    spec: SamplerSpec
    store: str
    host: str
    port: int
    api_key: str | None
    litellm_config: Path | None
    default_max_tokens: int
    rollout_idle_timeout: float | None
    torch_threads: int | None
    max_request_bytes: int | None = None
    log_requests: bool = True
    reuse_port: bool = False
    adapter_dir: Path | None = None
    litellm_admin_routes: bool = False


def _serve_one(settings: _ServeSettings, on_ready: Callable[[Any, str], None]) -> None:
    """Load the model's tokenizer and sampler, then serve the proxy in the foreground until stopped."""
    from agl_bridge.models.loading import ModelNotFoundError, load_tokenizer, resolve_model_path
    from agl_bridge.proxy.server import ProxyServer, ProxyStartError
    from agl_bridge.sampler.factory import build_sampler
    from agl_bridge.sampler.kv_batch import UnsupportedArchitectureError
    from agl_bridge.sampler.vllm import VLLMSettingError
    from agl_bridge.store.errors import StoreError

    spec = settings.spec
    if spec.kind == "hf":
        import torch

        from agl_bridge.sampler.hf import serving_torch_threads

        torch.set_num_threads(settings.torch_threads or serving_torch_threads())
    try:
        path = resolve_model_path(settings.model)
        tokenizer = load_tokenizer(path)
        # A serve's remote sampler follows the adapters a trainer loads into its servers (it loads none itself).
        sampler = build_sampler(
            spec, path, tokenizer, served_name=settings.name, process_by_default=True, follow_adapters=True
        )
    except (ModelNotFoundError, OSError, UnsupportedArchitectureError) as exc:
        _fail(f"cannot load model {settings.model!r}: {exc}")
    except ImportError as exc:  # --sampler vllm without vLLM or without a GPU: the message says what to install
        _fail(str(exc))
    except VLLMSettingError as exc:  # vLLM refused an engine setting; the message names it
        _fail(f"--sampler vllm: {exc}")
    try:
        server = ProxyServer(
            sampler=sampler,
            tokenizer=tokenizer,
            store_path=settings.store,
            model_name=settings.name,
            host=settings.host,
            port=settings.port,
            api_key=settings.api_key,
            litellm_config_path=settings.litellm_config,
            default_max_tokens=settings.default_max_tokens,
            rollout_idle_timeout_s=settings.rollout_idle_timeout,
            reuse_port=settings.reuse_port,
            max_request_bytes=settings.max_request_bytes,
            adapter_dir=settings.adapter_dir,
            litellm_admin_routes=settings.litellm_admin_routes,
        )
    except ProxyStartError as exc:
        sampler.close()
        _fail(str(exc))
    if settings.log_requests:
        from agl_bridge.proxy.access_log import log_requests as write_access_log

        write_access_log()
    try:
        server.serve_forever(on_ready=lambda ready: on_ready(ready, path))
    except KeyboardInterrupt:
        pass
    except (ProxyStartError, StoreError) as exc:
        _fail(f"{exc}")
    except OSError as exc:
        _fail(f"cannot serve: {exc}")
    finally:
        sampler.close()


def _announce(settings: _ServeSettings, path: str, base_url: str, key: str, generated: bool, workers: int = 1) -> None:
    """The lines `serve` prints once it answers: where, which key, the per-rollout and lifecycle URLs."""
    spec, idle = settings.spec, settings.rollout_idle_timeout
    processes = f" ({workers} processes on one port)" if workers > 1 else ""
    typer.echo(f"agl-bridge is serving {settings.name!r} ({path}) at {base_url}/v1{processes}", err=True)
    if spec.kind == "remote":
        typer.echo(f"  sampling on {', '.join(spec.urls)} as {spec.remote_model or settings.name!r}", err=True)
    typer.echo(f"  key: {key}" + ("  (generated; pass --api-key to choose one)" if generated else ""), err=True)
    typer.echo(f"  per rollout: {base_url}/rollout/ROLLOUT_ID/attempt/ATTEMPT_ID/v1", err=True)
    typer.echo(
        f"  agents get a key of their own attempt, not this one: POST {base_url}/rollout/ROLLOUT_ID/attempt/"
        "ATTEMPT_ID/agent_key (or the agent_key that .../start answers)",
        err=True,
    )
    typer.echo(
        f"  lifecycle: POST {base_url}/rollout/ROLLOUT_ID/attempt/ATTEMPT_ID/start|reward|finish"
        + (f" (idle rollouts time out after {idle:g} s)" if idle else ""),
        err=True,
    )
    where = (
        describe_location(settings.store) if is_postgres_location(settings.store) else Path(settings.store).resolve()
    )
    typer.echo(f"  recording into {where}; Ctrl-C stops", err=True)


def _serve_workers(settings: _ServeSettings, workers: int) -> None:
    """Run `workers` proxy processes on one port (SO_REUSEPORT) until Ctrl-C / SIGTERM, and stop them all.

    Each worker is a whole `serve` (its own LiteLLM proxy, remote-sampler client and store
    connection); the kernel spreads connections across them and stops sending any to one that
    exited, so the others keep serving every rollout (their token caches refill from the store).
    """
    import multiprocessing
    import queue
    import signal

    from agl_bridge.proxy.server import ProxyStartError, bind_socket, choose_api_key

    try:
        key, generated = choose_api_key(settings.host, settings.api_key)
        port = settings.port
        if port == 0:  # every worker must bind the same port: choose it here
            with bind_socket(settings.host, 0) as probe:
                port = probe.getsockname()[1]
    except ProxyStartError as exc:
        _fail(str(exc))
    shared = dataclasses.replace(settings, api_key=key, port=port, reuse_port=True)
    context = multiprocessing.get_context("spawn")
    ready: Any = context.Queue()
    processes = [
        context.Process(target=_serve_worker, args=(shared, index, ready), name=f"agl-serve-{index}", daemon=True)
        for index in range(workers)
    ]
    # Ctrl-C and SIGTERM stop the workers, also where SIGINT was inherited ignored (a shell's background
    # job): the single-process serve gets the same from uvicorn, which installs its own handlers.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        for process in processes:
            process.start()
        answered: list[tuple[str, str]] = []
        while len(answered) < workers:
            try:
                answered.append(ready.get(timeout=1.0))
            except queue.Empty:
                if any(not p.is_alive() for p in processes):
                    _fail("a serve worker exited while starting (its error is above); stopped the others", code=1)
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        _announce(shared, answered[0][1], f"http://{host}:{port}", key, generated, workers)
        exited: set[int] = set()
        while len(exited) < workers:
            for index, process in enumerate(processes):
                process.join(timeout=0.5)
                if index not in exited and not process.is_alive():
                    exited.add(index)
                    left = workers - len(exited)
                    typer.echo(
                        f"serve worker {index} (pid {process.pid}) exited with code {process.exitcode}; "
                        f"{left} still serve{'s' if left == 1 else ''} on port {port}",
                        err=True,
                    )
    except KeyboardInterrupt:
        pass
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
        deadline = time.monotonic() + WORKER_STOP_S
        for process in processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
        for process in processes:  # a worker stuck in its shutdown must not keep Ctrl-C from returning
            if process.is_alive():
                typer.echo(f"serve worker pid {process.pid} did not stop in {WORKER_STOP_S:g} s; killed it", err=True)
                process.kill()
                process.join()


def _serve_worker(settings: _ServeSettings, index: int, ready: Any) -> None:
    """One `--workers` process: serve until the parent stops it; dies with the parent (Linux)."""
    import signal

    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no orphan workers
    except (OSError, AttributeError):
        pass
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        _serve_one(settings, lambda ready_server, path: ready.put((ready_server.base_url, str(path))))
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None


@app.command("train")
def train_command(
    config: Path = typer.Option(
        ..., "--config", metavar="FILE", help="Run settings (.toml, .yaml or .json); see docs/training.md."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint in the config's run_dir."),
) -> None:
    """Train an agent with GRPO through the proxy (sample, convert, train, sync weights live), or DPO (mode = "dpo")."""
    from agl_bridge.primitives.checkpoint import CheckpointMismatchError
    from agl_bridge.runner import TaskFileError
    from agl_bridge.train.config import ConfigError, load_config
    from agl_bridge.train.grpo import GRPOTrainer

    try:
        run_config = load_config(config)
        if _serve_as_launched_worker(run_config):
            return
        trainer = GRPOTrainer(run_config)
        summary = trainer.run(resume=resume)
    except (ConfigError, TaskFileError, CheckpointMismatchError) as exc:
        _fail(str(exc))
    except StoreError as exc:  # the run's store (or offline data's) failed: one line, not a traceback
        _fail(str(exc), code=1)
    typer.echo(
        f"done: {summary.steps} steps in {summary.wall_time_s:.0f}s; held-out reward {summary.eval_start} → "
        f"{summary.eval_end}; see {summary.run_dir}"
    )
    typer.echo(f"look at it: agl-bridge view --run-dir {summary.run_dir}")


def _serve_as_launched_worker(run_config: GRPOConfig) -> bool:
    """Under torchrun, every rank but 0 serves rank 0's trainer as a data-parallel worker (docs/scaling.md)."""
    from agl_bridge.primitives.data_parallel import launched_rank, serve_worker
    from agl_bridge.train.step import rank_group

    if launched_rank() in (None, 0):
        return False
    group = rank_group(run_config)
    try:
        serve_worker(group, config_digest=run_config.digest())
    finally:
        group.close()
    return True


@app.command("view")
def view_command(
    store: str | None = typer.Option(
        None,
        "--store",
        envvar=STORE_ENV,
        metavar="PATH|URL",
        help="The store to look at, read-only: a SQLite file or a PostgreSQL URL (postgresql://user@host:port/db); "
        f"default: ${STORE_ENV}, else the run's store (RUN_DIR/store.sqlite, or the PostgreSQL URL of its config).",
    ),
    run_dir: Path | None = typer.Option(
        None,
        "--run-dir",
        metavar="DIR",
        help="A training run directory: curves from metrics.jsonl, settings from config.json.",
    ),
    model: str | None = typer.Option(
        None, "--model", help="Tokenizer for the token text: `tiny`, a model directory or hub id (default: the run's)."
    ),
    host: str = typer.Option("127.0.0.1", help="Address to bind; anything but loopback needs --api-key."),
    port: int = typer.Option(8765, min=0, max=65535, help="Port to listen on (0 picks a free one)."),
    api_key: str | None = typer.Option(
        None, envvar="AGL_API_KEY", help="Key the browser must bring; generated and printed if not given."
    ),
) -> None:
    """Look at a store and a training run in the browser: curves, rollouts, calls, and the tokens trained."""
    from agl_bridge.proxy.server import ProxyStartError, bind_socket, choose_api_key
    from agl_bridge.viewer.app import Viewer
    from agl_bridge.viewer.run_dir import RunConfigError, run_store
    from agl_bridge.viewer.server import serve_viewer

    if run_dir is not None and not run_dir.is_dir():
        _fail(f"--run-dir {run_dir} is not a directory; pass the run_dir of a training run")
    if store is None:
        if run_dir is None:
            _fail(
                "pass --store PATH|URL (a store file or PostgreSQL URL), or --run-dir DIR (a training run; its store "
                "is DIR/store.sqlite, or the PostgreSQL store its config names)"
            )
        store = run_store(run_dir)
    try:
        key, generated = choose_api_key(host, api_key)
        viewer = Viewer(store, run_dir, model)
    except (ProxyStartError, RunConfigError) as exc:
        _fail(str(exc))
    except StoreError as exc:
        _store_failure(exc, store)
    try:
        sock = bind_socket(host, port)
    except ProxyStartError as exc:
        viewer.close()
        _fail(str(exc))

    def announce(url: str) -> None:
        typer.echo(f"agl-bridge view at {url}", err=True)
        where = describe_location(store) if is_postgres_location(store) else Path(store).resolve()
        typer.echo(f"  store {where} (read-only)" + (f", run {run_dir.resolve()}" if run_dir else ""), err=True)
        if generated:
            typer.echo("  the key in that address was generated; pass --api-key to choose one", err=True)
        typer.echo("  Ctrl-C stops", err=True)

    try:
        serve_viewer(viewer, sock, key=key, on_ready=announce)
    except KeyboardInterrupt:
        pass


@app.command("serve-tinker")
def serve_tinker_command(
    model: list[str] = typer.Option(
        [],
        "--model",
        metavar="NAME=PATH",
        help="Serve a model name recipes use from a local model: `Qwen/Qwen3-8B=tiny`, `NAME=/models/dir`; repeat for "
        "several. Other names are loaded as themselves (`tiny`, a directory, a hub id in the local cache).",
    ),
    root: Path = typer.Option(
        Path("runs/tinker"), "--root", metavar="DIR", help="Where checkpoints (tinker://... paths) are kept."
    ),
    host: str = typer.Option("127.0.0.1", help="Address to bind; anything but loopback needs --api-key."),
    port: int = typer.Option(8000, min=0, max=65535, help="Port to listen on (0 picks a free one)."),
    api_key: str | None = typer.Option(
        None, envvar="TINKER_API_KEY", help="Key clients must send (starting tml-); generated and printed if not given."
    ),
    device: str | None = typer.Option(None, help="Torch device for training and sampling (default: CUDA if any)."),
) -> None:
    """Serve the Tinker API: the unmodified `tinker` SDK and tinker-cookbook code train and sample here."""
    from agl_bridge.proxy.server import ProxyStartError, bind_socket, is_loopback
    from agl_bridge.tinker_api.server import TinkerServer, check_api_key

    names: dict[str, str] = {}
    for entry in model:
        name, sep, target = entry.partition("=")
        if not sep or not name or not target:
            _fail(f"--model {entry!r}: expected NAME=PATH, e.g. --model Qwen/Qwen3-8B=tiny")
        names[name] = target
    if api_key is None and not is_loopback(host):
        _fail(f"refusing to bind {host} (reachable from other machines) without --api-key tml-...; or bind 127.0.0.1")
    try:
        if api_key is not None:
            check_api_key(api_key)
        sock = bind_socket(host, port)
    except (ProxyStartError, ValueError) as exc:
        _fail(str(exc))
    server = TinkerServer(sock, root.resolve(), models=names, api_key=api_key, device=device)
    typer.echo(f"Tinker API at {server.base_url}  (checkpoints under {root.resolve()})", err=True)
    typer.echo(f"  export TINKER_BASE_URL={server.base_url} TINKER_API_KEY={server.api_key}", err=True)
    for name, target in names.items():
        typer.echo(f"  {name} -> {target}", err=True)
    typer.echo("  Ctrl-C stops", err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


@app.command("plot")
def plot_command(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="A training run directory (with metrics.jsonl)."),
    out: Path | None = typer.Option(
        None, "--out", metavar="FILE.png", help="Where to write (default RUN_DIR/reward_curve.png)."
    ),
) -> None:
    """Draw a run's reward and evaluation curves as a PNG."""
    from agl_bridge.train.plot import plot_run

    if not (run_dir / "metrics.jsonl").is_file():
        _fail(f"no metrics.jsonl in {run_dir}; pass the run_dir of a training run")
    try:
        typer.echo(f"wrote {plot_run(run_dir, out)}")
    except ValueError as exc:
        _fail(str(exc))


@app.command("export", help=_EXPORT_HELP)
def export_command(
    store: str = typer.Option(..., "--store", envvar=STORE_ENV, metavar="PATH|URL", help=_STORE_HELP),
    what: ExportWhat = typer.Option(
        ExportWhat.CALLS,
        "--what",
        help="What to export. calls: every LLM call and reward, one JSON record each. "
        "trajectories: what GRPO trains on, one record per succeeded attempt.",
    ),
    out: Path = typer.Option(
        ..., "--out", metavar="FILE", help="File to write (replaced if it exists; its directory must exist)."
    ),
    file_format: ExportFormat = typer.Option(
        ExportFormat.JSONL, "--format", help="File format: jsonl, or parquet (trajectories only)."
    ),
    rollout: str | None = typer.Option(None, "--rollout", metavar="ID", help="Only this rollout's records."),
    missing_reward: str = typer.Option(
        "drop",
        "--missing-reward",
        metavar="drop|zero|error",
        help=f"An attempt with no reward: skip it, train it with return 0, or stop with an error {_TRAJECTORY_ONLY}.",
    ),
    reward_weight: list[str] = typer.Option(
        [],
        "--reward-weight",
        metavar="NAME=W",
        help=f"Weight of a named reward in the return (default 1) {_TRAJECTORY_ONLY}.",
    ),
    model: list[str] = typer.Option(
        [], "--model", metavar="NAME", help=f"Train only calls of this model; repeat for several {_TRAJECTORY_ONLY}."
    ),
    agent: list[str] = typer.Option(
        [], "--agent", metavar="NAME", help=f"Train only calls of this agent; repeat for several {_TRAJECTORY_ONLY}."
    ),
    train_classes: str = typer.Option(
        "main,subagent",
        "--train-classes",
        metavar="CLASSES",
        help="The call classes that train, comma-separated, of main, retry, side, compaction, subagent "
        f"(docs/trajectories.md, What trains) {_TRAJECTORY_ONLY}.",
    ),
) -> None:
    """Export calls and rewards, or trajectories (formats: `agl_bridge.store.export`, docs/trajectories.md)."""
    from agl_bridge.convert.errors import ConversionError
    from agl_bridge.convert.policy import ConvertOptions

    if not is_postgres_location(store):
        file = Path(store).resolve()
        if out.resolve() in {file, Path(f"{file}-wal"), Path(f"{file}-shm")}:
            _fail(f"--out {out} is the store itself; write the export to another file")
    options: ConvertOptions | None = None
    if what is ExportWhat.CALLS:
        if file_format is not ExportFormat.JSONL:
            _fail("--what calls is written as JSON Lines only; drop --format parquet (Parquet is for trajectories)")
        if missing_reward != "drop" or reward_weight or model or agent or train_classes != "main,subagent":
            _fail(
                "--missing-reward, --reward-weight, --model, --agent and --train-classes apply to "
                "--what trajectories only"
            )
    else:
        try:
            options = ConvertOptions(
                models=frozenset(model) if model else None,
                agent_names=frozenset(agent) if agent else None,
                reward_weights=_reward_weights(reward_weight),
                missing_reward=missing_reward,  # type: ignore[arg-type]  # validated by ConvertOptions
                train_classes=train_classes,  # type: ignore[arg-type]  # a comma-separated string is parsed there
            )
        except ValueError as exc:
            _fail(str(exc).replace("train_classes", "--train-classes"))

    async def run() -> ExportCounts:
        async with open_existing_store(store) as opened:
            return await EXPORTERS[what](opened, out, rollout_id=rollout, file_format=file_format, options=options)

    try:
        counts = asyncio.run(run())
    except (StoreError, ExportOutputError) as exc:
        _store_failure(exc, store)
    except (ConversionError, ImportError) as exc:
        _fail(str(exc), code=1)  # the data (or the installation), not the command line
    scope = f" of rollout {rollout}" if rollout is not None else ""
    typer.echo(_export_summary(what, counts, scope, out))
    if isinstance(counts, TrajectoryExportCounts):
        for line in (counts.report.left_out(), counts.report.by_class_line()):
            if line:
                typer.echo(line, err=True)


_INSPECT_HELP = (
    "Summarise a store: its rollouts with call and reward counts, or one rollout in detail.\n\n"
    "Rollouts are listed in creation order; with --rollout, each attempt's calls and rewards in sequence "
    "order. Counts and reward sums cover every record even when --limit cuts the listing."
)


@app.command("inspect", help=_INSPECT_HELP)
def inspect_command(
    store: str = typer.Option(..., "--store", envvar=STORE_ENV, metavar="PATH|URL", help=_STORE_HELP),
    rollout: str | None = typer.Option(
        None, "--rollout", metavar="ID", help="Show this rollout's attempts, calls and rewards instead of the list."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of tables."),
    limit: int = typer.Option(
        100, "--limit", metavar="N", min=0, help="Most rollouts listed, or records per attempt with --rollout; 0: all."
    ),
) -> None:
    """Summarise a store's rollouts, or one rollout in detail (views: `agl_bridge.store.inspect`)."""
    from rich.console import Console

    from agl_bridge.convert.graph import label_calls
    from agl_bridge.store.inspect import render_overview, render_rollout_detail, rollout_detail, store_overview

    bound = limit or None

    async def run() -> tuple[dict[str, Any], RenderableType]:
        async with open_existing_store(store) as opened:
            if rollout is None:
                overview = await store_overview(opened, limit=bound, name=describe_location(store))
                return overview.to_json(), render_overview(overview)
            detail = await rollout_detail(opened, rollout, limit=bound, classify=label_calls)
            return detail.to_json(), render_rollout_detail(detail)

    try:
        document, view = asyncio.run(run())
    except StoreError as exc:
        _store_failure(exc, store)
    if as_json:
        typer.echo(json.dumps(document, indent=2, ensure_ascii=False))
    else:
        Console(highlight=False).print(view)


if __name__ == "__main__":
    app()
