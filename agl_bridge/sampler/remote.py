"""`RemoteSampler`: a `TokenSampler` over HTTP to servers that speak vLLM's token protocol.

Point it at one or more vLLM OpenAI-compatible servers (or other `agl-bridge serve` processes):
token-id prompts go out on `POST /v1/completions`, token ids, raw logprobs and the finish reason
come back (`agl_bridge.sampler.remote_protocol`). One pooled, keep-alive `aiohttp.ClientSession`
per event loop carries the requests (aiohttp rather than httpx: a call costs the caller's loop about
a third of the CPU time, which every sampled call pays); sync callers share one on a private loop.

Routing (`agl_bridge.sampler.remote_pool`): the requests of one rollout stay on one server (its
prefix cache keeps the rollout's earlier turns); a server that is down, slow, answers 5xx or answers
without token ids is taken out of rotation for a cooldown and the request moves to the next one.
Only when every server failed does the request fail, with an error naming each server and what
went wrong — the proxy then answers the agent with an error and records nothing.

Weights (`load_adapter`): the trainer writes each new peft adapter under `adapter_dir` (a folder
every server can read) and the sampler loads it on every server as `<model>-v<N>` with vLLM's
`POST /v1/load_lora_adapter`; new requests name that adapter as their `model`, so each token's
policy version is the N of the adapter that produced it. Older adapters are unloaded
(`/v1/unload_lora_adapter`) once no request in flight still uses them. A server that missed a load
(down at the time) gets the current adapter before its next request.

Following (`follow_adapters`, what `agl-bridge serve --sampler remote` runs): a proxy that samples
from the servers a trainer loads adapters into, without doing the loads itself (a scaled-out run's
extra proxies), names the newest `<model>-v<N>` its servers list on `GET /v1/models` (vLLM lists
each loaded adapter with `parent` = the base model), asked before its first request and then at
most every `adapter_refresh_s` in the background; with none listed, the base model (version 0).
Each token still reports the version of the adapter its request named, so a follower that is a
refresh behind records older tokens, never wrong ones. When the trainer unloads the adapter a
request named (404), the follower asks again and sends the request once more with the newest one
(nothing was sampled yet). A follower never loads a new adapter or unloads one: the trainer does.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import re
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from agl_bridge import semconv
from agl_bridge.sampler._loop_thread import LoopThread
from agl_bridge.sampler.affinity import current_affinity
from agl_bridge.sampler.base import ContextLengthError, SampleResult, SamplingParams
from agl_bridge.sampler.remote_errors import (
    RemoteContextLengthError,
    RemoteRequestError,
    RemoteSamplerError,
    ServerFailure,
)
from agl_bridge.sampler.remote_pool import ServerPool, ServerState
from agl_bridge.sampler.remote_protocol import (
    completion_body,
    error_message,
    listed_adapters,
    parse_completion,
    parse_prompt_logprobs,
    scoring_body,
    served_context_window,
)

__all__ = ["RemoteContextLengthError", "RemoteRequestError", "RemoteSampler", "RemoteSamplerError"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

_ALREADY_LOADED = re.compile(r"already been loaded", re.IGNORECASE)
_CONTEXT_WORDS = re.compile(r"context length|context window|maximum context", re.IGNORECASE)


class RemoteSampler:
    """A `TokenSampler` whose model runs on one or more vLLM-protocol servers.

    urls: the servers' base URLs (`http://host:port`, with or without `/v1`).
    model: the name the servers serve the base model under (vLLM's `--served-model-name`).
    api_key: sent as `Authorization: Bearer` (vLLM's `--api-key`, agl-bridge serve's `--api-key`).
    vocab_size: prompt ids are checked against it before a request goes out (None: the servers check).
    max_context: the context window assumed for a server whose `/v1/models` does not give its
      `max_model_len` (vLLM's does: each server's own is used, and `max_context` is their smallest).
    max_batch_size: most samples one request may ask for (the proxy's limit on `n`).
    timeout_s: longest wait for one answer; a server slower than that counts as failed.
    cooldown_s: how long a failed server stays out of rotation.
    adapter_dir: folder the trainer writes adapters into, readable by every server at the same path.
    follow_adapters: sample with the newest `<model>-v<N>` adapter the servers list instead of loading
      adapters (see the module docs); `adapter_refresh_s`: how often the list is asked again.
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        model: str,
        api_key: str | None = None,
        vocab_size: int | None = None,
        max_context: int = 32768,
        max_batch_size: int = 64,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        cooldown_s: float = 10.0,
        max_connections: int = 256,
        adapter_dir: str | os.PathLike[str] | None = None,
        follow_adapters: bool = False,
        adapter_refresh_s: float = 1.0,
    ) -> None:
        if isinstance(urls, str):
            urls = [u for u in urls.split(",") if u.strip()]
        if not model:
            raise ValueError("RemoteSampler needs the model name the servers serve (vLLM's --served-model-name)")
        for name, value in (
            ("timeout_s", timeout_s),
            ("connect_timeout_s", connect_timeout_s),
            ("cooldown_s", cooldown_s),
            ("adapter_refresh_s", adapter_refresh_s),
        ):
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
        self.pool = ServerPool(urls, cooldown_s=cooldown_s)
        self.model = model
        self.max_batch_size = max_batch_size
        self.adapter_dir = None if adapter_dir is None else Path(adapter_dir)
        self._vocab_size = vocab_size
        self._max_context = max_context
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=connect_timeout_s)
        self._max_connections = max_connections
        self._headers = {
            "Content-Type": "application/json",
            semconv.HEADER_RECORDED_UPSTREAM: "1",
            **({"Authorization": f"Bearer {api_key}"} if api_key else {}),
        }
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = (
            weakref.WeakKeyDictionary()
        )
        # Per caller loop: a task that closes that loop's session when cancelled (see `_client`).
        self._closers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = (
            weakref.WeakKeyDictionary()
        )
        self._loop_thread = LoopThread("agl-remote-sampler")
        self._lock = threading.Lock()
        self._active = (model, 0)  # (adapter name requests use, its policy version)
        self._adapter_paths: dict[str, str] = {}
        self._in_flight: dict[str, int] = {}
        self._retiring: set[str] = set()
        self._closed = False
        self._follows = follow_adapters
        self._refresh_s = adapter_refresh_s
        self._refresh_due: float | None = None  # monotonic time of the next background refresh; None: never asked
        self._refreshes: set[asyncio.Task[int]] = set()

    # ------------------------------------------------------------------ TokenSampler

    @property
    def policy_version(self) -> int:
        """The version of the adapter new requests name (0: the base model)."""
        return self._active[1]

    @property
    def active_model(self) -> str:
        """The model name new requests send: the base name, or `<model>-v<N>` after a weight sync."""
        return self._active[0]

    @property
    def max_context(self) -> int:
        """Most tokens (prompt + sampled) a sequence may have: the smallest `max_model_len` the servers report.

        Until a server has been asked (on its first request) or where it reports none, the
        configured `max_context` stands in for it.
        """
        windows = [s.max_model_len or self._max_context for s in self.pool.servers]
        return min(windows)

    @property
    def vocab_size(self) -> int | None:
        """Vocabulary size prompts are checked against (None: not checked locally)."""
        return self._vocab_size

    def sample(self, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int = 1) -> SampleResult:
        """Sample `num_samples` continuations of `prompt_tokens`, blocking until all are done."""
        return self._run_sync(self.sample_async(prompt_tokens, params, num_samples))

    async def sample_async(
        self, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int = 1
    ) -> SampleResult:
        """Sample on the rollout's server (or the next healthy one); RemoteSamplerError if none can."""
        prompt = self._check(prompt_tokens, params, num_samples)
        return await self._with_policy(
            "sampling",
            lambda name, window: completion_body(name, prompt, params, num_samples, window),
            lambda url, answer, version: parse_completion(url, answer, prompt, num_samples, version),
            len(prompt),
        )

    def compute_logprobs(self, token_ids: Sequence[int]) -> list[float | None]:
        """Raw logprob of each token given the ones before it (vLLM's `prompt_logprobs`); the first is None."""
        return self._run_sync(self.compute_logprobs_async(token_ids))

    async def compute_logprobs_async(self, token_ids: Sequence[int]) -> list[float | None]:
        """Async form of `compute_logprobs`."""
        ids = [int(t) for t in token_ids]
        if len(ids) <= 1:
            return [None] * len(ids)
        if len(ids) >= self.max_context:
            raise ContextLengthError(len(ids), self.max_context)
        return await self._with_policy(
            "scoring",
            lambda name, window: scoring_body(name, ids),
            lambda url, answer, _version: parse_prompt_logprobs(url, answer, ids),
            len(ids),
        )

    # ------------------------------------------------------------------ weight sync

    def adapter_path(self, version: int) -> Path:
        """Where the adapter of policy `version` is written: `adapter_dir/<model>-v<version>`."""
        if self.adapter_dir is None:
            raise ValueError(
                "syncing weights to remote servers needs adapter_dir: a folder the trainer writes adapters into "
                "and every server reads at the same path (config key adapter_dir)"
            )
        return self.adapter_dir / f"{self.model.replace('/', '--')}-v{version}"

    def load_adapter(self, path: str | os.PathLike[str], version: int | None = None) -> int:
        """Load the peft adapter at `path` on every server as `<model>-v<version>` and sample with it from now on.

        version: default the current version + 1. Returns the new policy version. Servers that fail
        are taken out of rotation (and get the adapter before their next request); if none loads
        it, RemoteSamplerError and nothing changes. A following sampler refuses (its trainer loads).
        """
        return self._run_sync(self.load_adapter_async(path, version))

    async def load_adapter_async(self, path: str | os.PathLike[str], version: int | None = None) -> int:
        """Async form of `load_adapter`."""
        if self._follows:
            raise RemoteSamplerError(
                "this sampler follows the adapters its servers list (agl-bridge serve --sampler remote) and loads "
                "none itself: load adapters on the servers (a trainer's sampler_urls name them)"
            )
        new_version = self.policy_version + 1 if version is None else int(version)
        name = f"{self.model}-v{new_version}"
        where = str(Path(path).resolve())
        self._adapter_paths[name] = where
        results = await asyncio.gather(
            *(self._load_on(server, name, where) for server in self.pool.servers), return_exceptions=True
        )
        failures = []
        for server, result in zip(self.pool.servers, results, strict=True):
            if isinstance(result, ServerFailure):
                self.pool.mark_down(server, result.reason)
                failures.append((server.url, result.reason))
            elif isinstance(result, BaseException):
                raise result
        if len(failures) == len(self.pool.servers):
            self._adapter_paths.pop(name, None)
            raise RemoteSamplerError.from_failures(f"loading adapter {name!r} from {where}", failures)
        for url, reason in failures:
            logger.warning("sampler server %s is out of rotation: %s", url, reason)
        with self._lock:
            self._active = (name, new_version)
            retire = [n for n in self._adapter_paths if n != name]
        for old in retire:
            await self._retire(old)
        return new_version

    async def refresh_adapters(self) -> int:
        """Following: sample with the newest `<model>-v<N>` the servers list on `/v1/models` (the base model if
        they list none); returns the policy version new requests name. Servers that do not answer are
        skipped; if none answers, nothing changes."""
        if not self._follows:
            raise RemoteSamplerError("only a following sampler (follow_adapters) takes its adapter from the servers")
        client = self._client()
        servers = list(self.pool.servers)
        answers = await asyncio.gather(
            *(self._request(client, server, "GET", "/v1/models") for server in servers), return_exceptions=True
        )
        listed: dict[str, tuple[int, str]] = {}
        answered = False
        for server, answer in zip(servers, answers, strict=True):
            if isinstance(answer, ServerFailure) or (isinstance(answer, _Answer) and answer.status >= 400):
                continue
            if isinstance(answer, BaseException):
                raise answer
            answered = True
            body = answer.json()
            server.max_model_len = served_context_window(body, self.model)
            on_server = listed_adapters(body, self.model)
            server.loaded = set(on_server)
            listed.update(on_server)
        if answered:
            newest = max(listed.items(), key=lambda item: item[1][0], default=None)
            with self._lock:
                self._active = (self.model, 0) if newest is None else (newest[0], newest[1][0])
                self._adapter_paths = {name: root for name, (_, root) in listed.items() if root}
        self._refresh_due = time.monotonic() + self._refresh_s
        return self.policy_version

    async def _follow(self) -> None:
        """Following: ask the servers which adapter is newest before the first request, then in the background
        at most every `adapter_refresh_s` (the request goes on with the adapter known so far)."""
        if not self._follows:
            return
        if self._refresh_due is None:
            await self.refresh_adapters()
            return
        if time.monotonic() < self._refresh_due:
            return
        self._refresh_due = time.monotonic() + self._refresh_s  # set now: concurrent requests start no second one
        refresh = asyncio.get_running_loop().create_task(self.refresh_adapters())
        self._refreshes.add(refresh)
        refresh.add_done_callback(self._refreshed)

    def _refreshed(self, refresh: asyncio.Task[int]) -> None:
        self._refreshes.discard(refresh)
        if not refresh.cancelled() and refresh.exception() is not None:
            logger.warning("asking the sampler servers for their adapters failed: %s", refresh.exception())

    async def _unload_all(self) -> None:
        """Unload every adapter we loaded; the last one's folder stays (the run's newest weights)."""
        with self._lock:
            last = self._active[0]
            self._active = (self.model, self._active[1])  # nothing of ours stays active
        for name in list(self._adapter_paths):
            await self._retire(name, keep_folder=name == last)

    def status(self) -> list[dict[str, object]]:
        """Each server's URL, whether it is in rotation, its last error, requests in flight."""
        return self.pool.status()

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Unload the adapters this sampler loaded (the servers keep no slot for a finished run), close the
        HTTP clients and the private loop."""
        if self._closed:
            return
        if self._adapter_paths and not self._follows and not self._loop_thread.is_current():
            try:
                self._loop_thread.run(asyncio.wait_for(self._unload_all(), timeout=30))
            except (TimeoutError, RemoteSamplerError) as error:
                logger.warning("could not unload every adapter at close: %s", error)
        self._closed = True
        private = self._loop_thread.started_loop
        own = self._clients.pop(private, None) if private is not None else None
        for loop, closer in list(self._closers.items()):
            if loop.is_running() and not loop.is_closed():
                loop.call_soon_threadsafe(closer.cancel)
        self._clients.clear()
        self._closers.clear()
        self._loop_thread.close(own.close() if own is not None else None)

    def __enter__(self) -> RemoteSampler:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _check(self, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int) -> list[int]:
        params.validate(self._vocab_size)
        if (
            not isinstance(num_samples, int)
            or isinstance(num_samples, bool)
            or not 1 <= num_samples <= self.max_batch_size
        ):
            raise ValueError(f"num_samples must be an integer in 1..{self.max_batch_size}, got {num_samples!r}")
        prompt = [int(t) for t in prompt_tokens]
        if not prompt:
            raise ValueError("prompt_tokens must contain at least one token")
        if self._vocab_size is not None and any(t < 0 or t >= self._vocab_size for t in prompt):
            bad = next(t for t in prompt if t < 0 or t >= self._vocab_size)
            raise ValueError(f"prompt token id {bad} is outside the vocabulary 0..{self._vocab_size - 1}")
        if len(prompt) >= self.max_context:
            raise ContextLengthError(len(prompt), self.max_context)
        return prompt

    def _begin(self) -> tuple[str, int]:
        with self._lock:
            name, version = self._active
            self._in_flight[name] = self._in_flight.get(name, 0) + 1
        return name, version

    def _end(self, name: str) -> None:
        with self._lock:
            self._in_flight[name] -= 1
            idle = self._in_flight[name] == 0
            if idle:
                del self._in_flight[name]
            retire = idle and name in self._retiring
        if retire and not self._closed:
            # The last request that used an old adapter is done: unload it off this request's path.
            self._loop_thread.submit(self._retire(name))

    async def _with_policy(
        self,
        what: str,
        make_body: Callable[[str, int], dict[str, Any]],
        parse: Callable[[str, Any, int], T],
        prompt_length: int,
    ) -> T:
        """`_call` naming the adapter new requests use, parsed with its policy version. A follower whose adapter
        the trainer unloaded under it asks the servers again and sends the request once more (nothing was
        sampled: it is a new request, with the newest adapter and that one's version)."""
        await self._follow()
        for last_try in (False, True):
            name, version = self._begin()
            try:
                return await self._call(
                    what,
                    name,
                    functools.partial(make_body, name),
                    functools.partial(_parse_as, parse, version),
                    prompt_length,
                )
            except _AdapterRetired as retired:
                if last_try or not self._follows:
                    raise RemoteSamplerError.from_failures(what, [(retired.url, str(retired))]) from None
                await self.refresh_adapters()
            finally:
                self._end(name)
        raise AssertionError("unreachable: the last try returns or raises")

    async def _call(
        self,
        what: str,
        name: str,
        make_body: Callable[[int], dict[str, Any]],
        parse: Callable[[str, Any], T],
        prompt_length: int,
    ) -> T:
        """Send the body `make_body(server's context window)` to the best server that answers; parse its answer."""
        client = self._client()
        failures: list[tuple[str, str]] = []
        for server in self.pool.order(current_affinity()):
            self.pool.started(server)
            try:
                result = await self._call_server(client, server, name, make_body, parse, prompt_length)
            except ServerFailure as failure:
                server.max_model_len = None  # it may come back restarted with other settings: ask again
                self.pool.mark_down(server, failure.reason)
                failures.append((server.url, failure.reason))
                logger.warning("sampler server %s failed and is out of rotation: %s", server.url, failure.reason)
                continue
            finally:
                self.pool.finished(server)
            self.pool.mark_up(server)
            return result
        raise RemoteSamplerError.from_failures(what, failures)

    async def _call_server(
        self,
        client: aiohttp.ClientSession,
        server: ServerState,
        name: str,
        make_body: Callable[[int], dict[str, Any]],
        parse: Callable[[str, Any], T],
        prompt_length: int,
    ) -> T:
        window = await self._context_window(client, server)
        if prompt_length >= window:
            raise RemoteContextLengthError(
                server.url,
                prompt_length,
                window,
                f"its context window (max_model_len) is {window} tokens; shorten the prompt to at most {window - 1}",
            )
        if name != self.model and name not in server.loaded:
            await self._load_on(server, name, self._adapter_path_of(server, name))
        body = make_body(window)
        response = await self._post(client, server, "/v1/completions", body)
        if response.status == 404 and name != self.model:
            if self._follows:  # the trainer unloaded it: the caller adopts the newest and asks again
                raise _AdapterRetired(server.url, name)
            # The server lost the adapter (restarted?): load it again and retry there once.
            server.loaded.discard(name)
            await self._load_on(server, name, self._adapter_paths[name])
            response = await self._post(client, server, "/v1/completions", body)
        answer = response.json()
        if response.status >= 400:
            self._raise_for_status(server, response.status, answer, prompt_length)
        return parse(server.url, answer)

    def _raise_for_status(self, server: ServerState, status: int, answer: Any, prompt_length: int) -> None:
        message, param, code = error_message(answer, f"HTTP {status} with no error message")
        if status in (401, 403):
            raise ServerFailure(
                server.url,
                f"refused our key (HTTP {status}: {message}); pass the server's key as --sampler-api-key "
                "(or sampler_api_key in the trainer config)",
            )
        if status >= 500 or status in (404, 408, 429):
            raise ServerFailure(server.url, f"HTTP {status}: {message}")
        if code == "context_length_exceeded" or _CONTEXT_WORDS.search(message):
            window = server.max_model_len or self._max_context
            server.max_model_len = None  # its settings may have changed since we asked: ask again next time
            raise RemoteContextLengthError(server.url, prompt_length, window, message)
        raise RemoteRequestError(server.url, status, message, param)

    def _adapter_path_of(self, server: ServerState, name: str) -> str:
        """The folder to load `name` from on a server that does not have it (a follower: as another server lists it)."""
        path = self._adapter_paths.get(name)
        if path is None:  # a follower's adapter no server lists any more
            raise _AdapterRetired(server.url, name)
        return path

    async def _context_window(self, client: aiohttp.ClientSession, server: ServerState) -> int:
        """The server's `max_model_len` from its `/v1/models` (asked once), else the configured max_context."""
        if server.max_model_len is None:
            answer = await self._request(client, server, "GET", "/v1/models")
            server.max_model_len = served_context_window(answer.json(), self.model) if answer.status < 400 else 0
        return server.max_model_len or self._max_context

    async def _post(
        self, client: aiohttp.ClientSession, server: ServerState, path: str, body: dict[str, Any]
    ) -> _Answer:
        return await self._request(client, server, "POST", path, json.dumps(body, separators=(",", ":")).encode())

    async def _request(
        self, client: aiohttp.ClientSession, server: ServerState, method: str, path: str, data: bytes | None = None
    ) -> _Answer:
        try:
            async with client.request(method, f"{server.url}{path}", data=data) as response:
                return _Answer(response.status, await response.read())
        except TimeoutError as error:  # aiohttp's timeouts are asyncio.TimeoutError subclasses
            raise ServerFailure(
                server.url,
                f"no answer on {path} within the timeout ({_timeout_text(self._timeout)}; {type(error).__name__})",
            ) from None
        except aiohttp.ClientError as error:
            raise ServerFailure(server.url, f"cannot reach {path}: {error or type(error).__name__}") from None

    async def _load_on(self, server: ServerState, name: str, path: str) -> None:
        response = await self._post(
            self._client(), server, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}
        )
        if response.status >= 400:
            raw = response.text[:300] or f"HTTP {response.status}"
            message, _, _ = error_message(response.json(), raw)
            if not _ALREADY_LOADED.search(message):
                # A 404 without an error body of vLLM's own: the route is not there (no LoRA on that server).
                # vLLM's own 404 ("No adapter found for ...") means the server cannot read the folder.
                hint = (
                    " (start vLLM with --enable-lora --max-lora-rank R --max-loras 2 and the environment "
                    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"
                    if response.status == 404 and message == raw
                    else " (the folder must be readable by the server at this same path)"
                    if response.status == 404
                    else ""
                )
                raise ServerFailure(
                    server.url, f"loading adapter {name!r} from {path} failed (HTTP {response.status}: {message}){hint}"
                )
        server.loaded.add(name)

    async def _retire(self, name: str, *, keep_folder: bool = False) -> None:
        """Unload `name` everywhere once no request uses it; delete its folder if we wrote it (unless keep_folder)."""
        with self._lock:
            if name == self._active[0]:
                self._retiring.discard(name)
                return
            if self._in_flight.get(name):
                self._retiring.add(name)
                return
            self._retiring.discard(name)
        client = self._client()
        for server in self.pool.servers:
            if name not in server.loaded:
                continue
            try:
                response = await self._post(client, server, "/v1/unload_lora_adapter", {"lora_name": name})
            except ServerFailure as failure:
                logger.warning("could not unload adapter %r from %s: %s", name, server.url, failure.reason)
                continue
            if response.status < 400 or response.status == 404:
                server.loaded.discard(name)
            else:
                logger.warning(
                    "could not unload adapter %r from %s: HTTP %s %s",
                    name,
                    server.url,
                    response.status,
                    response.text[:200],
                )
        path = self._adapter_paths.pop(name, None)
        if keep_folder or path is None:
            return
        if self.adapter_dir is not None and Path(path).parent == self.adapter_dir.resolve():
            shutil.rmtree(path, ignore_errors=True)

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            if self._closed:
                raise RemoteSamplerError("the remote sampler is closed; create a new one")
            connector = aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=60)
            client = aiohttp.ClientSession(connector=connector, timeout=self._timeout, headers=self._headers)
            self._clients[loop] = client
            if not self._loop_thread.is_current():
                # A caller's loop (the proxy's) may end before `close()`: asyncio.run cancels the tasks
                # left when its main coroutine returns, and this one then closes the session on its loop.
                self._closers[loop] = loop.create_task(_close_when_cancelled(client))
        return client

    def _run_sync(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self._loop_thread.is_current():
            coroutine.close()
            raise RuntimeError("call the *_async methods from inside the sampler's own loop")
        return self._loop_thread.run(coroutine)


@dataclass(frozen=True, slots=True)
class _Answer:
    """A server's HTTP answer, read whole."""

    status: int
    content: bytes

    def json(self) -> Any:
        """The body as JSON, or None if it is not JSON."""
        try:
            return json.loads(self.content)
        except ValueError:
            return None

    @property
    def text(self) -> str:
        """The body as text (undecodable bytes replaced)."""
        return self.content.decode("utf-8", errors="replace")


def _parse_as(parse: Callable[[str, Any, int], T], version: int, url: str, answer: Any) -> T:
    return parse(url, answer, version)


class _AdapterRetired(Exception):
    """A following sampler's request named an adapter the servers no longer have (the trainer unloaded it)."""

    def __init__(self, url: str, name: str) -> None:
        super().__init__(f"adapter {name!r} is not loaded on {url} any more (the trainer unloaded it)")
        self.url = url


async def _close_when_cancelled(client: aiohttp.ClientSession) -> None:
    try:
        await asyncio.Event().wait()
    finally:
        await client.close()


def _timeout_text(timeout: aiohttp.ClientTimeout) -> str:
    return f"connect {timeout.sock_connect:g}s, whole answer {timeout.total:g}s"
