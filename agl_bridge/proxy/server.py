"""Running the proxy: our gateway in front of LiteLLM's proxy app and our own routes, over one store.

`ProxyServer` runs everything on one asyncio loop — in a background thread (`start`/`stop`, used by
the trainer and the tests, which also share the sampler) or in the calling thread
(`serve_forever`, used by `agl-bridge serve`). LiteLLM's proxy keeps its state in module globals,
so one process holds at most one proxy.

Served model names map to LiteLLM entries `agl/<name>`; a user LiteLLM config adds other models
(judges, frozen answerers) to the same endpoint, and calls to them are recorded as text-only.

The rollout lifecycle routes (`lifecycle.py`: start, reward, finish) are our bare routes on the
front door. With `rollout_idle_timeout_s`, a sweep times out every external rollout with no call,
reward or request for that long (`Store.expire_idle_rollouts`): such a rollout never trains.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import secrets
import shutil
import socket
import tempfile
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import yaml
from fastapi import APIRouter
from starlette.routing import BaseRoute

from agl_bridge.agent_keys import AgentKeys, derived_key
from agl_bridge.chat import ChatCodec, TextBound
from agl_bridge.proxy.adapters import AdapterRegistry, make_adapter_router
from agl_bridge.proxy.chat_route import ChatRoute
from agl_bridge.proxy.completions import make_completions_router
from agl_bridge.proxy.errors import install_error_handlers
from agl_bridge.proxy.gateway import NO_NATIVE_TELEMETRY, Gateway
from agl_bridge.proxy.lifecycle import make_lifecycle_router
from agl_bridge.proxy.litellm_hooks import GATEWAY_AUTH, ModelCheck, TextCallLogger
from agl_bridge.proxy.litellm_patches import patch_litellm, resolve_routes
from agl_bridge.proxy.provider import PROVIDER_NAME, AglProvider
from agl_bridge.proxy.recording import CallRecorder
from agl_bridge.proxy.request import RequestError
from agl_bridge.proxy.responses import make_responses_router, use_id_secret
from agl_bridge.proxy.service import PASSED_FIELDS, ChatService
from agl_bridge.proxy.token_history import StoreTokenHistory
from agl_bridge.sampler.base import TokenSampler
from agl_bridge.store.base import Store
from agl_bridge.store.errors import StoreError
from agl_bridge.store.location import is_postgres_location, store_at
from agl_bridge.store.postgres import PostgresStore
from agl_bridge.store.sqlite import SQLiteStore

logger = logging.getLogger(__name__)
T = TypeVar("T")

_LOOPBACK_NAMES = {"localhost", "ip6-localhost"}
MIN_MAX_REQUEST_BYTES = 4 * 1024 * 1024
"""The smallest default body limit: room for LiteLLM's other routes and OTLP span batches."""
JSON_BYTES_PER_CHAR = 6
"""The most bytes JSON spends on one character of text (`\\u00XX`)."""
FALLBACK_CHARS_PER_TOKEN = 32
"""Characters per token assumed for a tokenizer with no known bound (`agl_bridge.chat.text_bound`)."""


def max_request_bytes(bound: TextBound, max_context: int) -> int:
    """The default request-body limit: no smaller than the largest body a prompt that fits could need.

    A prompt that fits has at most `max_context` tokens, each standing for at most
    `bound.chars_per_token` characters, each at most `JSON_BYTES_PER_CHAR` bytes of JSON; at least
    `MIN_MAX_REQUEST_BYTES`. With the tiny model that is 4 MiB at 4,096 tokens and 24 MiB at 65,536;
    with a 40,960-token Qwen3 (entries of up to ~64 bytes, NFC) about 60 MiB.
    """
    chars = bound.chars_per_token or FALLBACK_CHARS_PER_TOKEN
    return max(MIN_MAX_REQUEST_BYTES, JSON_BYTES_PER_CHAR * chars * max_context)


class ProxyStartError(RuntimeError):
    """The proxy cannot start; the message says why and what to do."""


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server reachable from this machine only."""
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def choose_api_key(host: str, api_key: str | None) -> tuple[str, bool]:
    """The key to require and whether it was generated; a non-loopback bind needs an explicit key."""
    if api_key:
        return api_key, False
    if not is_loopback(host):
        raise ProxyStartError(
            f"refusing to bind {host} (reachable from other machines) without an explicit key: pass "
            "--api-key KEY (or set AGL_API_KEY), or bind 127.0.0.1"
        )
    return "sk-agl-" + secrets.token_urlsafe(24), True


def bind_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A listening socket on (host, port), port 0 picking a free one; a clear error if it is taken.

    reuse_port: several processes listen on the same port (SO_REUSEPORT) and the kernel spreads new
    connections across them (`agl-bridge serve --workers N`); a process that exits stops getting any.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio sets TCP_NODELAY only on accepted sockets whose proto is
    # IPPROTO_TCP (and they inherit it from this one). With proto 0, Nagle holds back the response
    # body (a second small write) until the client's delayed ACK: +40 ms on every response.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise ProxyStartError(
            f"cannot listen on {host}:{port} ({error.strerror}); the port is in use or the address is not "
            "this machine's: pick another with --port (0 picks a free one) or stop the process using it"
        ) from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def litellm_config(served: list[str], api_key: str, user_config: Path | None = None) -> dict[str, Any]:
    """The LiteLLM proxy config: our models first, then the user's; retries off, our key."""
    user: dict[str, Any] = {}
    if user_config is not None:
        try:
            user = yaml.safe_load(Path(user_config).read_text()) or {}
        except (OSError, yaml.YAMLError) as error:
            raise ProxyStartError(f"cannot read the LiteLLM config {user_config}: {error}") from None
        if not isinstance(user, dict):
            raise ProxyStartError(f"the LiteLLM config {user_config} must be a mapping with model_list etc.")
    user_models = user.get("model_list") or []
    if not isinstance(user_models, list):
        raise ProxyStartError(f"model_list in {user_config} must be a list")
    clashes = sorted(set(served) & {m.get("model_name") for m in user_models if isinstance(m, dict)})
    if clashes:
        raise ProxyStartError(
            f"the LiteLLM config {user_config} also defines {clashes}, which agl-bridge serves; rename them"
        )
    litellm_settings = dict(user.get("litellm_settings") or {})
    if "custom_provider_map" in litellm_settings:
        raise ProxyStartError(
            f"litellm_settings.custom_provider_map in {user_config} would replace agl-bridge's provider; remove it"
        )
    general = {**(user.get("general_settings") or {}), "master_key": api_key}
    general.setdefault("trusted_proxy_ranges", [])
    # Every admitted request is the admin (the gateway is the one key check), so LiteLLM's encryption of
    # Responses ids protects nothing; plain ids let `responses.key_of` find the call an id names.
    general["disable_responses_id_security"] = True
    return {
        "model_list": [
            {
                "model_name": name,
                # LiteLLM refuses fields it thinks an OpenAI-like provider cannot take; the service decides.
                "litellm_params": {"model": f"{PROVIDER_NAME}/{name}", "allowed_openai_params": list(PASSED_FIELDS)},
            }
            for name in served
        ]
        + user_models,
        "litellm_settings": {"drop_params": False, "expose_router_debug_in_errors": False, **litellm_settings},
        "router_settings": {"num_retries": 0, "disable_cooldowns": True, **(user.get("router_settings") or {})},
        "general_settings": general,
    }


class ProxyServer:
    """The proxy over one sampler, recording into a store (a SQLite file or a PostgreSQL database)."""

    _claimed = False
    _claim_lock = threading.Lock()

    def __init__(
        self,
        *,
        sampler: TokenSampler,
        tokenizer: Any,
        store_path: str | os.PathLike[str],
        model_name: str = "tiny",
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        litellm_config_path: str | os.PathLike[str] | None = None,
        default_max_tokens: int = 1024,
        rollout_idle_timeout_s: float | None = None,
        max_request_bytes: int | None = None,
        reuse_port: bool = False,
        adapter_dir: str | os.PathLike[str] | None = None,
        litellm_admin_routes: bool = False,
    ) -> None:
        if rollout_idle_timeout_s is not None and not rollout_idle_timeout_s > 0:
            raise ProxyStartError(f"the rollout idle timeout must be > 0 seconds, got {rollout_idle_timeout_s!r}")
        self.rollout_idle_timeout_s = rollout_idle_timeout_s
        self.sampler = sampler
        self.codec = ChatCodec(tokenizer)
        # A SQLite file path, or a PostgreSQL URL (kept as text: a Path would fold its '//').
        self.store_path: Path | str = store_path if is_postgres_location(store_path) else Path(store_path)
        self.model_name = model_name
        self.host = host
        self.api_key, self.generated_key = choose_api_key(host, api_key)
        self.agent_keys = AgentKeys(self.api_key)
        self.adapter_dir = None if adapter_dir is None else Path(adapter_dir)
        self.litellm_admin_routes = litellm_admin_routes
        self._socket = bind_socket(host, port, reuse_port=reuse_port)
        self.port = self._socket.getsockname()[1]
        self._user_config = None if litellm_config_path is None else Path(litellm_config_path)
        self.default_max_tokens = default_max_tokens
        if max_request_bytes is not None and max_request_bytes < 1:
            raise ProxyStartError(f"the request body limit must be at least 1 byte, got {max_request_bytes}")
        self.max_request_bytes = max_request_bytes or _default_limit(self.codec, sampler)
        self.store: SQLiteStore | PostgresStore | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._uvicorn: Any = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._config_dir: str | None = None

    # ---------------------------------------------------------------- addresses

    @property
    def base_url(self) -> str:
        """`http://host:port` of the server."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def openai_base_url(self, rollout_id: str | None = None, attempt_id: str | None = None) -> str:
        """The `base_url` an OpenAI client uses, optionally routed to one rollout attempt."""
        if rollout_id is None:
            return f"{self.base_url}/v1"
        return f"{self.base_url}/rollout/{rollout_id}/attempt/{attempt_id or 'a0'}/v1"

    def agent_key(self, rollout_id: str, attempt_id: str, *, ttl_s: float | None = None) -> str:
        """A key for an agent of one rollout attempt: its model routes under that attempt, nothing else."""
        return self.agent_keys.mint(rollout_id, attempt_id, ttl_s=ttl_s)

    # ---------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 180.0) -> ProxyServer:
        """Start in a background thread and return once the server answers requests."""
        self._thread = threading.Thread(target=self._run_in_thread, name="agl-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout) or self._failure is not None:
            self.stop()
            if self._failure is not None:
                raise ProxyStartError(f"the proxy failed to start: {self._failure}") from self._failure
            raise ProxyStartError(f"the proxy did not become ready within {timeout:.0f}s")
        return self

    def serve_forever(self, on_ready: Any = None) -> None:
        """Run in the calling thread until interrupted (Ctrl-C / SIGTERM)."""
        asyncio.run(self._main(on_ready))

    def stop(self, timeout: float = 30.0) -> None:
        """Stop serving, flush and close the store, and release the port."""
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._socket.close()

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def run_coroutine(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run a coroutine on the server's loop (e.g. a store query) from another thread."""
        if self.loop is None:
            raise RuntimeError("the proxy is not running")
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    # ---------------------------------------------------------------- internals

    def _run_in_thread(self) -> None:
        try:
            asyncio.run(self._main(None))
        except BaseException as error:  # reported to start() instead of dying silently in the thread
            self._failure = error
            self._ready.set()

    async def _main(self, on_ready: Any) -> None:
        with ProxyServer._claim_lock:
            if ProxyServer._claimed:
                raise ProxyStartError("a proxy already ran in this process; LiteLLM's proxy supports one per process")
            ProxyServer._claimed = True
        import uvicorn

        from agl_bridge.tracing import StoreSink, make_traces_router, set_reward_sink

        self.loop = asyncio.get_running_loop()
        self.store = store_at(self.store_path)
        await self.store.open()
        use_id_secret(derived_key(self.api_key, b"agl-bridge response ids v1"))
        previous_sink = set_reward_sink(StoreSink(self.store, self.loop))
        try:
            recorder = CallRecorder(self.store)
            service = ChatService(
                sampler=self.sampler,
                codec=self.codec,
                recorder=recorder,
                model_name=self.model_name,
                history=StoreTokenHistory(self.store),
                default_max_tokens=self.default_max_tokens,
                max_samples_per_request=getattr(self.sampler, "max_batch_size", 64),
            )
            provider = AglProvider()
            provider.register(service)
            front = Gateway(
                self._litellm_app(provider, recorder, make_traces_router(self.store)),
                api_key=self.api_key,
                routes=self._token_routes(provider, self.store)
                + make_lifecycle_router(self.running_store, self.agent_keys).routes,
                chat=ChatRoute({service.model_name: service}.get),
                max_body_bytes=self.max_request_bytes,
                management_routes=self.litellm_admin_routes,
            )
            config = uvicorn.Config(
                front,
                loop="asyncio",  # uvloop crashed LiteLLM (ContextVar.set segfault) under error-heavy load
                lifespan="on",
                log_level="warning",
                access_log=False,
                timeout_graceful_shutdown=5,
                # uvicorn's 5 s default closes pooled client connections that agents reuse after a pause
                # (a tool call, a queue under load): the request in flight on the race gets a ReadError.
                timeout_keep_alive=75,
            )
            self._uvicorn = uvicorn.Server(config)
            serving = asyncio.create_task(self._uvicorn.serve(sockets=[self._socket]))
            while not self._uvicorn.started and not serving.done():
                await asyncio.sleep(0.02)
            if serving.done():
                await serving
                raise ProxyStartError("the HTTP server stopped during start-up")
            await asyncio.to_thread(resolve_routes, front.app)  # before any client's first request
            self._ready.set()
            if on_ready is not None:
                on_ready(self)
            sweeping = None if self.rollout_idle_timeout_s is None else asyncio.create_task(self._sweep_idle())
            try:
                await serving
            finally:
                if sweeping is not None:
                    sweeping.cancel()
        finally:
            set_reward_sink(previous_sink)
            await self.store.close()
            if self._config_dir is not None:
                shutil.rmtree(self._config_dir, ignore_errors=True)

    def running_store(self) -> SQLiteStore | PostgresStore:
        """The store the proxy records into, open while it runs; RuntimeError before `start` or after `stop`.

        Any thread or event loop of this process may use it (a store serves them all): code beside
        the proxy, such as the trainer, uses this one rather than opening the file again, so the
        process has one writer connection and never contends with itself for the store's write lock.
        """
        if self.store is None or self.loop is None or not self.loop.is_running():
            raise RuntimeError("the proxy's store is not open: start the proxy first (and use it before stop)")
        return self.store

    async def _sweep_idle(self) -> None:
        """Time out idle external rollouts, checking a few times per timeout (at most every 10 s)."""
        idle = self.rollout_idle_timeout_s
        assert idle is not None
        while True:
            await asyncio.sleep(min(max(idle / 4, 0.05), 10.0))
            try:
                expired = await self.running_store().expire_idle_rollouts(idle)
            except StoreError as error:  # the store is busy or full: try again at the next sweep
                logger.warning("the idle-rollout sweep failed: %s", error)
                continue
            if expired:
                logger.warning("%d idle rollout attempt(s) timed out after %g s without activity", len(expired), idle)

    def _litellm_app(self, provider: AglProvider, recorder: CallRecorder, traces_router: APIRouter) -> Any:
        """LiteLLM's proxy app, configured to serve our models through `provider` behind the gateway, with
        the OTLP receiver ahead of LiteLLM's own `/v1/traces` routes.

        The receiver stays in LiteLLM's app (its other methods on `/v1/traces` are LiteLLM's), so the
        app's route table lists it with every other route the key guards.
        """
        import litellm
        from litellm.utils import custom_llm_setup

        litellm.custom_provider_map = [{"provider": PROVIDER_NAME, "custom_handler": provider}]
        custom_llm_setup()
        ours = (ModelCheck, TextCallLogger)
        litellm.callbacks = [
            *[c for c in litellm.callbacks if not isinstance(c, ours)],
            ModelCheck(provider),
            TextCallLogger(recorder),
        ]

        config = litellm_config([self.model_name], self.api_key, self._user_config)
        # The gateway checks the key of every request; LiteLLM trusts it instead of checking again
        # (a user's own custom_auth still runs, behind the gateway's check).
        config["general_settings"].setdefault("custom_auth", GATEWAY_AUTH)
        self._config_dir = tempfile.mkdtemp(prefix="agl-litellm-")
        config_path = Path(self._config_dir) / "litellm_config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        os.environ["CONFIG_FILE_PATH"] = str(config_path)  # LiteLLM reads its config path at start-up

        from litellm.proxy import proxy_server

        app = proxy_server.app
        _without_native_telemetry(app)
        install_error_handlers(app)  # LiteLLM's answer some errors as {"detail": ...} or with code "400"
        patch_litellm()  # LiteLLM bugs that answer malformed requests with a 500
        app.router.routes[:0] = traces_router.routes
        return app

    def _token_routes(self, provider: AglProvider, store: Store) -> list[BaseRoute]:
        """Token-id `/v1/completions` over the served model, the stored Responses, and vLLM's LoRA routes where
        the sampler loads adapters."""
        adapters = AdapterRegistry()

        def service_for(model: str) -> ChatService:
            if adapters.version_of(model) is not None:
                return provider.service(self.model_name)  # one merged weight set serves every loaded name
            service = provider.find(model)
            if service is not None:
                return service
            if adapters.names() or model.startswith(f"{self.model_name}-v"):
                raise RequestError(
                    f"adapter {model!r} is not loaded on this server (loaded: {adapters.names()}); load it with "
                    "POST /v1/load_lora_adapter",
                    "model",
                    code="model_not_found",
                    status=404,
                )
            raise RequestError(f"model {model!r} is not served here; served: {[self.model_name]}", "model")

        routes = make_completions_router(service_for).routes
        routes += make_responses_router(store, self.codec).routes
        if hasattr(self.sampler, "load_lora"):
            routes += make_adapter_router(self.sampler, adapters, self.adapter_dir).routes
        return routes


def _default_limit(codec: ChatCodec, sampler: TokenSampler) -> int:
    return max_request_bytes(codec.text_bound, sampler.max_context)


def _without_native_telemetry(app: Any) -> None:
    """Stop FastAPI (0.165+) from tracing each request of `app` into the global TracerProvider.

    Once an agent in the same process installs a provider (agentops does, as does
    `configure_agent_tracing`), every proxy request would become a span exported to the proxy's own
    `/v1/traces`, whose handling makes more spans: a loop that fills the store with spans of no
    rollout. The proxy records what matters itself. LiteLLM builds the app, so its settings are
    changed in place.
    """
    settings = getattr(app, "_telemetry", None)
    if isinstance(settings, dict):
        settings.update(NO_NATIVE_TELEMETRY)
