"""Shared pytest fixtures: the offline tiny model (built once per session) and its tokenizer, stores, the proxy.

The hub switches are set before anything imports transformers or huggingface_hub (they read them
at import time), so no test can reach the network by accident. Shared plain helpers (ids, ports,
clients) are in tests/shared_helpers.py.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from agl_bridge.store import SQLiteStore
    from agl_bridge.types import LLMCall


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Under CI=true, a skip for something CI must provide (`skip_groups.SKIP_GROUPS`) fails the test instead."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.skipped and _in_ci() and not hasattr(report, "wasxfail"):
        from skip_groups import skip_group

        reason = _skip_reason(report)
        group = skip_group(reason)
        if group is not None and group.required_in_ci:
            report.outcome = "failed"
            report.longrepr = f"CI=true must not skip {group.name}: {reason} — {group.enable} (.ci/run does)"


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """At the end of a run: every skipped group, how many, and the one command that enables it."""
    from skip_groups import summary_lines

    skipped = [r for r in terminalreporter.stats.get("skipped", []) if not hasattr(r, "wasxfail")]
    if not skipped:
        return
    terminalreporter.section("skipped, and how to run them")
    for line in summary_lines([_skip_reason(report) for report in skipped]):
        terminalreporter.write_line(line)


@pytest.fixture(scope="session", autouse=True)
def _private_agl_bridge_cache(tmp_path_factory: pytest.TempPathFactory):
    """Point AGL_BRIDGE_CACHE at a per-session temp dir so tests never write to the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AGL_BRIDGE_CACHE", str(tmp_path_factory.mktemp("agl_bridge_cache")))
        yield


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of the default tiny model (hidden 128, 2 layers, vocab 2048, seed 0), built once."""
    from agl_bridge.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model") / "tiny")


@pytest.fixture
def make_client(tiny_model_dir: Path) -> Iterator[Callable[..., Any]]:
    """Factory for TrainingClients on the tiny model (closed after the test); kwargs go to the client."""
    from agl_bridge.primitives import TrainingClient

    clients: list[TrainingClient] = []

    def make(**kwargs: Any) -> TrainingClient:
        kwargs.setdefault("lora_rank", 8)
        client = TrainingClient(str(kwargs.pop("base_model", tiny_model_dir)), device="cpu", **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path):
    """The tiny model's tokenizer, loaded with plain AutoTokenizer (a TokenizersBackend)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def postgres_server():
    """A throwaway PostgreSQL server for the session (`agl_bridge.testing.postgres`); skips saying why if none."""
    from agl_bridge.testing.postgres import PostgresUnavailable, start_postgres

    try:
        server = start_postgres()
    except PostgresUnavailable as exc:
        pytest.skip(f"no PostgreSQL server can run here: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_dsn(postgres_server) -> str:
    """The URL of a new, empty store location (a schema of its own) on the session's PostgreSQL server."""
    import uuid

    return postgres_server.create_schema(f"t_{uuid.uuid4().hex[:12]}")


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    """Where the test's store file lives."""
    return tmp_path / "store.db"


@pytest.fixture
async def store(store_path: Path) -> AsyncIterator[SQLiteStore]:
    """An open store on the test's event loop, closed after the test."""
    from agl_bridge.store import SQLiteStore

    async with SQLiteStore(store_path) as opened:
        yield opened


@pytest.fixture
def make_call() -> Callable[..., LLMCall]:
    """Factory of token calls with short, distinct lists; keyword arguments override fields."""
    from agl_bridge.types import LLMCall

    def factory(**overrides: Any) -> LLMCall:
        fields: dict[str, Any] = {
            "rollout_id": "ro-1",
            "attempt_id": "at-1",
            "model": "tiny",
            "prompt_token_ids": [1, 2, 3],
            "response_token_ids": [4, 5],
            "response_logprobs": [-0.25, -1.5],
            "messages": [{"role": "user", "content": "hi"}],
            "response_text": "hello",
            "finish_reason": "stop",
        }
        fields.update(overrides)
        return LLMCall(**fields)

    return factory


class RecordingSampler:
    """A test-only `TokenSampler` in front of an HF sampler that logs what it served.

    Every request it answers is appended to `served` as (prompt ids, num_samples, params, result),
    so tests can check the store against what the sampler really consumed and produced. `script`
    makes it answer prompts whose text contains a marker with fixed ids (scored by the real model),
    e.g. a tool call the random tiny model would never sample.
    """

    def __init__(self, inner, tokenizer) -> None:
        self.inner = inner
        self.tokenizer = tokenizer
        self.served: list[tuple[list[int], int, object, object]] = []
        self._scripts: dict[str, tuple[list[list[int]], int | None]] = {}
        self._lock = threading.Lock()

    # The TokenSampler surface, delegated.
    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    @property
    def max_context(self) -> int:
        return self.inner.max_context

    @property
    def vocab_size(self) -> int:
        return self.inner.vocab_size

    @property
    def max_batch_size(self) -> int:
        return self.inner.max_batch_size

    def script(self, marker: str, token_ids: list[int] | list[list[int]], times: int | None = None) -> None:
        """Answer prompts whose decoded text contains `marker` with `token_ids` (the next `times` ones, or all).

        A list of id lists gives sample i of a request the ids `token_ids[i % len(token_ids)]`.
        """
        scripts = (
            [list(ids) for ids in token_ids] if token_ids and isinstance(token_ids[0], list) else [list(token_ids)]
        )
        with self._lock:
            self._scripts[marker] = (scripts, times)

    def served_for(self, prompt_ids: list[int]) -> list[tuple[list[int], int, object, object]]:
        """The logged requests whose prompt was exactly `prompt_ids`."""
        with self._lock:
            return [entry for entry in self.served if entry[0] == list(prompt_ids)]

    def _log(self, prompt_tokens, num_samples, params, result):
        with self._lock:
            self.served.append((list(prompt_tokens), num_samples, params, result))
        return result

    def _scripted(self, prompt_tokens, params, num_samples):
        from agl_bridge.sampler.base import SampledSequence, SampleResult

        with self._lock:
            if not self._scripts:
                return None
            text = self.tokenizer.decode(list(prompt_tokens), skip_special_tokens=False)
            chosen = next((marker for marker in self._scripts if marker in text), None)
            if chosen is None:
                return None
            script, times = self._scripts[chosen]
            if times is not None:
                if times <= 1:
                    del self._scripts[chosen]
                else:
                    self._scripts[chosen] = (script, times - 1)
        sequences = []
        for index in range(num_samples):
            full = script[index % len(script)]
            tokens = full[: params.max_tokens] if params.max_tokens else full
            scores = self.inner.compute_logprobs([*prompt_tokens, *tokens])[len(prompt_tokens) :]
            reason = "stop" if len(tokens) == len(full) else "length"
            sequences.append(
                SampledSequence(list(tokens), list(scores), reason, [self.inner.policy_version] * len(tokens))
            )
        return SampleResult(list(prompt_tokens), sequences)

    def sample(self, prompt_tokens, params, num_samples=1):
        result = self._scripted(prompt_tokens, params, num_samples) or self.inner.sample(
            prompt_tokens, params, num_samples
        )
        return self._log(prompt_tokens, num_samples, params, result)

    async def _scripted_async(self, prompt_tokens, params, num_samples):
        if not self._scripts:
            return None
        return await asyncio.to_thread(self._scripted, prompt_tokens, params, num_samples)

    async def sample_async(self, prompt_tokens, params, num_samples=1):
        scripted = await self._scripted_async(prompt_tokens, params, num_samples)
        result = scripted or await self.inner.sample_async(prompt_tokens, params, num_samples)
        return self._log(prompt_tokens, num_samples, params, result)

    async def sample_stream(self, prompt_tokens, params, num_samples=1):
        from agl_bridge.sampler.base import SampleResult, TokenEvent

        scripted = await self._scripted_async(prompt_tokens, params, num_samples)
        if scripted is not None:
            for index, seq in enumerate(scripted.sequences):
                for token, logprob, version in zip(seq.tokens, seq.logprobs, seq.token_policy_versions, strict=True):
                    yield TokenEvent(index, token, logprob, version)
            yield self._log(prompt_tokens, num_samples, params, scripted)
            return
        async for item in self.inner.sample_stream(prompt_tokens, params, num_samples):
            if isinstance(item, SampleResult):
                self._log(prompt_tokens, num_samples, params, item)
            yield item

    def compute_logprobs(self, token_ids):
        return self.inner.compute_logprobs(token_ids)

    async def compute_logprobs_async(self, token_ids):
        return await self.inner.compute_logprobs_async(token_ids)

    async def compute_top_logprobs_async(self, token_ids, k, start):
        return await self.inner.compute_top_logprobs_async(token_ids, k, start)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(scope="session")
def proxy_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """One running `ProxyServer` on the tiny model ("tiny") for the whole session, started on first use.

    LiteLLM's proxy is a process-wide singleton, so every test shares this server: use distinct
    rollout ids. `proxy_server.sampler` is a `RecordingSampler` (its `served` log is what the
    sampler really consumed and produced) over the sampler `agl-bridge serve` uses, an
    `HFProcessSampler`; `proxy_server.store` is queried with `run_coroutine`.
    """
    from agl_bridge.models.loading import load_tokenizer
    from agl_bridge.proxy.server import ProxyServer
    from agl_bridge.sampler.hf_process import HFProcessSampler

    tokenizer = load_tokenizer(tiny_model_dir)
    sampler = RecordingSampler(HFProcessSampler(tiny_model_dir, seed=0), tokenizer)
    try:
        server = ProxyServer(
            sampler=sampler, tokenizer=tokenizer, store_path=tmp_path_factory.mktemp("proxy") / "store.sqlite", port=0
        )
        server.start()
    except BaseException:
        sampler.close()
        raise
    try:
        yield server
    finally:
        server.stop()
        sampler.close()
