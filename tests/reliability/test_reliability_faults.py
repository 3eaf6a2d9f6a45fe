"""Faults survived: a proxy killed mid-stream or frozen, a locked store, agents that raise or hang.

After each: the client saw an error, the attempt ended failed or timed out (and was retried per the
policy), `PRAGMA integrity_check` passes, and no partial call reaches a trajectory. The trainer's
kill -9 is in test_reliability_trainer_kill.py; the store's own full-disk and locked-file errors are
tests/store/test_store_durability.py.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from shared_helpers import new_id, query

from agl_bridge.convert import convert_store
from agl_bridge.runner import RetryPolicy, Runner, RunnerConfig
from agl_bridge.store import SQLiteStore
from agl_bridge.testing.checks import integrity, openai_error_problem
from agl_bridge.testing.proxy_process import ProxyProcess
from agl_bridge.types import AttemptStatus, RolloutStatus

pytestmark = pytest.mark.slow


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def _run(
    proxy_url: str, api_key: str, store_path: Path, agent: Any, config: RunnerConfig, tasks: list[Any]
) -> tuple[Any, list[Any], list[Any]]:
    """Run `agent` over `tasks` with a Runner on its own connection to the store; outcomes, attempts, trajectories."""
    async with SQLiteStore(store_path) as store:
        runner = Runner(agent, server_url=proxy_url, api_key=api_key, model="tiny", store=store, config=config)
        try:
            outcomes = await runner.run(tasks)
        finally:
            runner.close()
        attempts = [a for o in outcomes for a in await store.list_attempts(o.rollout_id)]
        trajectories = [t async for t in convert_store(store, rollout_ids=[o.rollout_id for o in outcomes])]
    return outcomes, attempts, trajectories


def test_proxy_killed_mid_stream(proxy_process: Callable[..., ProxyProcess], tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite"
    proxy = proxy_process(store, sampler="slow", tokens=400, token_delay_s=0.02)
    chunks_seen = threading.Event()
    errors: list[BaseException] = []

    async def agent(task: Any, endpoint: Any) -> float:
        client = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0, timeout=30)
        try:
            stream = await client.chat.completions.create(
                model="tiny", messages=_user("count"), max_tokens=400, stream=True
            )
            received = 0
            async for _chunk in stream:
                received += 1
                if received == 3:
                    chunks_seen.set()
        except Exception as error:
            errors.append(error)
            raise
        finally:
            await client.close()
        return 1.0

    def killer() -> None:
        if chunks_seen.wait(60):
            proxy.kill()

    watcher = threading.Thread(target=killer, daemon=True)
    watcher.start()
    config = RunnerConfig(concurrency=1, timeout_s=60)
    outcomes, attempts, trajectories = asyncio.run(_run(proxy.base_url, proxy.api_key, store, agent, config, ["t"]))
    watcher.join(5)

    assert chunks_seen.is_set() and proxy.process.returncode == -signal.SIGKILL
    assert errors and isinstance(errors[0], (openai.APIError, httpx.HTTPError)), errors
    assert [o.status for o in outcomes] == [RolloutStatus.FAILED]
    assert [a.status for a in attempts] == [AttemptStatus.FAILED] and attempts[0].error
    assert integrity(store) == "ok"
    rollout = outcomes[0].rollout_id
    # A streamed call is committed only once complete: the killed one left no record at all.
    assert query(store, "SELECT count(*) FROM llm_calls WHERE rollout_key = ?", rollout) == [(0,)]
    assert trajectories == []

    # On restart the same store serves and records again.
    restarted = proxy_process(store, sampler="instant")
    rid = new_id("after-kill")
    with openai.OpenAI(base_url=restarted.rollout_url(rid, "at-1"), api_key=restarted.api_key, max_retries=0) as client:
        assert (
            client.chat.completions.create(model="tiny", messages=_user("hi"), max_tokens=4).choices[0].message.content
        )
    assert query(store, "SELECT count(*) FROM llm_calls WHERE rollout_key = ?", rid) == [(1,)]
    assert integrity(store) == "ok"


def test_frozen_proxy_times_the_attempt_out_and_retries(
    proxy_process: Callable[..., ProxyProcess], tmp_path: Path
) -> None:
    store = tmp_path / "store.sqlite"
    proxy = proxy_process(store, sampler="instant")
    proxy.process.send_signal(signal.SIGSTOP)  # up but never answering: a hung server

    async def agent(task: Any, endpoint: Any) -> float:
        client = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0, timeout=600)
        try:
            await client.chat.completions.create(model="tiny", messages=_user("hi"), max_tokens=2)
        finally:
            await client.close()
        return 1.0

    config = RunnerConfig(concurrency=2, timeout_s=1.5, retry=RetryPolicy(max_attempts=2))
    try:
        outcomes, attempts, trajectories = asyncio.run(_run(proxy.base_url, proxy.api_key, store, agent, config, ["t"]))
    finally:
        proxy.process.send_signal(signal.SIGCONT)
    assert [(o.status, o.attempts) for o in outcomes] == [(RolloutStatus.TIMED_OUT, 2)]
    assert [a.status for a in attempts] == [AttemptStatus.TIMED_OUT] * 2
    assert "timeout_s" in (outcomes[0].error or "")
    assert trajectories == [] and integrity(store) == "ok"


def test_a_locked_store_is_a_clear_503_and_nothing_half_written(proxy_server: Any) -> None:
    rid = new_id("locked")
    url = f"{proxy_server.base_url}/rollout/{rid}/attempt/at-1/v1/chat/completions"
    body = {"model": "tiny", "messages": _user(f"[{rid}]"), "max_tokens": 2}
    headers = {"Authorization": f"Bearer {proxy_server.api_key}"}
    blocker = sqlite3.connect(proxy_server.store_path, isolation_level=None, timeout=30)
    blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock past the busy timeout
    try:
        started = time.monotonic()
        refused = httpx.post(url, json=body, headers=headers, timeout=120)
        waited = time.monotonic() - started
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert refused.status_code == 503, refused.text
    error = refused.json()["error"]
    assert (
        error["code"] == "store_unavailable" and "locked" in error["message"] and "busy_timeout_s" in error["message"]
    )
    assert openai_error_problem(httpx.Response(400, json=refused.json())) is None, "same shape as the 4xx errors"
    assert waited < 60
    assert query(proxy_server.store_path, "SELECT count(*) FROM llm_calls WHERE rollout_key = ?", rid) == [(0,)]
    served = httpx.post(url, json=body, headers=headers, timeout=120)  # the lock is gone: served again
    assert served.status_code == 200, served.text
    assert query(proxy_server.store_path, "SELECT count(*) FROM llm_calls WHERE rollout_key = ?", rid) == [(1,)]
    assert integrity(proxy_server.store_path) == "ok"


def test_an_agent_that_raises_is_retried_and_only_the_good_attempt_is_trained(proxy_server: Any) -> None:
    tries: dict[Any, int] = {}

    async def agent(task: Any, endpoint: Any) -> float:
        tries[task] = tries.get(task, 0) + 1
        async with httpx.AsyncClient(timeout=120) as client:
            response = await client.post(
                f"{endpoint.base_url}/chat/completions",
                headers={"Authorization": f"Bearer {endpoint.api_key}"},
                json={"model": "tiny", "messages": _user(f"[{endpoint.rollout_id}]"), "max_tokens": 2},
            )
            response.raise_for_status()
        if tries[task] == 1:
            raise RuntimeError("the agent crashed after its call")
        return 1.0

    config = RunnerConfig(concurrency=4, timeout_s=120, retry=RetryPolicy(max_attempts=2))
    outcomes, attempts, trajectories = asyncio.run(
        _run(proxy_server.base_url, proxy_server.api_key, proxy_server.store_path, agent, config, ["a", "b"])
    )
    assert [(o.status, o.attempts) for o in outcomes] == [(RolloutStatus.SUCCEEDED, 2)] * 2
    failed = [a for a in attempts if a.status is AttemptStatus.FAILED]
    assert len(failed) == 2 and all("crashed" in (a.error or "") for a in failed)
    succeeded = {a.attempt_id for a in attempts if a.status is AttemptStatus.SUCCEEDED}
    assert len(trajectories) == 2 and {t.attempt_id for t in trajectories} == succeeded


def test_an_agent_that_hangs_times_out_per_attempt_and_is_never_trained(proxy_server: Any) -> None:
    async def agent(task: Any, endpoint: Any) -> float:
        async with httpx.AsyncClient(timeout=120) as client:
            await client.post(
                f"{endpoint.base_url}/chat/completions",
                headers={"Authorization": f"Bearer {endpoint.api_key}"},
                json={"model": "tiny", "messages": _user("hi"), "max_tokens": 2},
            )
        await asyncio.sleep(3600)
        return 1.0

    config = RunnerConfig(concurrency=2, timeout_s=1.0, retry=RetryPolicy(max_attempts=2))
    outcomes, attempts, trajectories = asyncio.run(
        _run(proxy_server.base_url, proxy_server.api_key, proxy_server.store_path, agent, config, ["h"])
    )
    assert [(o.status, o.attempts) for o in outcomes] == [(RolloutStatus.TIMED_OUT, 2)]
    assert [a.status for a in attempts] == [AttemptStatus.TIMED_OUT] * 2
    assert trajectories == []
