"""The Ray runner on a local Ray cluster (`ray.init(num_cpus=2)`): the local runner's semantics, attempts as Ray tasks.

Agents run in Ray worker processes: returned rewards, `emit_reward` through the proxy, failures
with their tracebacks and retries, timeouts, a worker killed mid-attempt (failed with the reason,
then retried), agent commands. The store is written by the driver (this process) only.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="the Ray runner's tests need Ray: pip install 'agl-bridge[ray]'")

from agl_bridge.runner import AgentCommand, Endpoint, RetryPolicy, RunnerConfig  # noqa: E402
from agl_bridge.runner.ray_runner import RayRunner  # noqa: E402
from agl_bridge.store import SQLiteStore  # noqa: E402
from agl_bridge.tracing import current_rollout, emit_reward  # noqa: E402
from agl_bridge.types import AttemptStatus, RolloutStatus  # noqa: E402

pytestmark = pytest.mark.slow

SERVER = "http://127.0.0.1:9"  # never contacted by the agents that report no reward through it


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    """A local Ray cluster of 2 CPUs for this module; its workers import the test modules like pytest does."""
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}},
    )
    try:
        yield
    finally:
        ray.shutdown()


def _runner(agent: Any, store: Any, server: str = SERVER, api_key: str = "sk-test", **config: Any) -> RayRunner:
    return RayRunner(
        agent, server_url=server, api_key=api_key, model="tiny", store=store, config=RunnerConfig(**config)
    )


def where_am_i(task: Any, endpoint: Endpoint) -> dict[str, float]:
    """A sync agent: the worker's pid as a 'reward', after checking its rollout context."""
    assert current_rollout().rollout_id == endpoint.rollout_id
    return {"pid": float(os.getpid()), "task": float(task)}


async def async_agent(task: Any, endpoint: Endpoint) -> float:
    await asyncio.sleep(0.01)
    return 0.5 if current_rollout().attempt_id == endpoint.attempt_id else -1.0


async def test_attempts_run_in_ray_workers_with_their_rollout_context(store: SQLiteStore) -> None:
    runner = _runner(where_am_i, store, group_size=2, concurrency=4)
    try:
        outcomes = await runner.run([1, 2], group_prefix="ray")
    finally:
        runner.close()
    assert [o.status for o in outcomes] == [RolloutStatus.SUCCEEDED] * 4, [o.error for o in outcomes]
    assert [o.group_id for o in outcomes] == ["ray-0", "ray-0", "ray-1", "ray-1"]
    assert all(o.rewards["pid"] != os.getpid() for o in outcomes), "the agent ran in this process"
    assert [o.rewards["task"] for o in outcomes] == [1.0, 1.0, 2.0, 2.0]
    rewards = [(r.name, r.value) async for r in store.iter_rewards(outcomes[0].rollout_id)]
    assert ("task", 1.0) in rewards  # recorded by the driver
    runner = _runner(async_agent, store)
    try:
        (outcome,) = await runner.run(["x"])
    finally:
        runner.close()
    assert outcome.rewards == {"reward": 0.5}


def fails_once(task: Any, endpoint: Endpoint) -> float:
    marker = Path(task) / endpoint.rollout_id
    if not marker.exists():
        marker.write_text(endpoint.attempt_id)
        raise ValueError("first attempts fail here")
    return 1.0


async def test_a_failure_is_recorded_with_its_traceback_and_retried(store: SQLiteStore, tmp_path: Path) -> None:
    runner = _runner(fails_once, store, retry=RetryPolicy(max_attempts=2))
    try:
        (outcome,) = await runner.run([str(tmp_path)])
    finally:
        runner.close()
    assert outcome.status is RolloutStatus.SUCCEEDED and outcome.attempts == 2
    first, second = await store.list_attempts(outcome.rollout_id)
    assert first.status is AttemptStatus.FAILED and first.error == "ValueError: first attempts fail here"
    assert "fails_once" in (first.traceback or "") and "raise ValueError" in (first.traceback or "")
    assert second.status is AttemptStatus.SUCCEEDED


async def hangs(task: Any, endpoint: Endpoint) -> None:
    await asyncio.sleep(60)


async def test_an_attempt_past_its_timeout_times_out_and_is_retried(store: SQLiteStore) -> None:
    runner = _runner(hangs, store, timeout_s=1.0, retry=RetryPolicy(max_attempts=2))
    began = time.monotonic()
    try:
        (outcome,) = await runner.run(["t"])
    finally:
        runner.close()
    assert outcome.status is RolloutStatus.TIMED_OUT and outcome.attempts == 2
    assert time.monotonic() - began < 30
    attempts = await store.list_attempts(outcome.rollout_id)
    assert [a.status for a in attempts] == [AttemptStatus.TIMED_OUT] * 2
    assert "within 1s" in (attempts[0].error or "")


def waits_to_be_killed(task: Any, endpoint: Endpoint) -> float:
    folder = Path(task)
    if not (folder / "killed-once").exists():
        (folder / "killed-once").write_text("")
        (folder / "pid").write_text(str(os.getpid()))
        time.sleep(120)
    return 2.0


async def test_a_worker_killed_mid_attempt_fails_it_with_the_reason_and_it_is_retried(
    store: SQLiteStore, tmp_path: Path
) -> None:
    runner = _runner(waits_to_be_killed, store, retry=RetryPolicy(max_attempts=2))

    async def kill_the_worker() -> None:
        while not (tmp_path / "pid").exists():
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.2)
        os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)

    try:
        killer = asyncio.create_task(kill_the_worker())
        (outcome,) = await runner.run([str(tmp_path)])
        await killer
    finally:
        runner.close()
    assert outcome.status is RolloutStatus.SUCCEEDED and outcome.attempts == 2 and outcome.rewards == {"reward": 2.0}
    first, second = await store.list_attempts(outcome.rollout_id)
    assert first.status is AttemptStatus.FAILED
    assert "the Ray task running this attempt failed" in (first.error or ""), first.error
    assert second.status is AttemptStatus.SUCCEEDED


async def test_agent_commands_run_in_workers_and_are_killed_on_timeout(store: SQLiteStore, tmp_path: Path) -> None:
    script = tmp_path / "agent.py"
    script.write_text("import json, os\nprint('agl-reward:', json.loads(os.environ['AGL_TASK'])['n'] * 2)\n")
    runner = _runner(AgentCommand([sys.executable, str(script)]), store)
    try:
        (outcome,) = await runner.run([{"n": 21}])
    finally:
        runner.close()
    assert outcome.status is RolloutStatus.SUCCEEDED and outcome.rewards == {"reward": 42.0}, outcome.error

    marker = tmp_path / "child-alive"
    hanging = AgentCommand(
        [sys.executable, "-c", f"import time, pathlib; time.sleep(1.5); pathlib.Path({str(marker)!r}).write_text('x')"]
    )
    runner = _runner(hanging, store, timeout_s=0.5)
    try:
        (outcome,) = await runner.run(["t"])
    finally:
        runner.close()
    await asyncio.sleep(2.0)
    assert outcome.status is RolloutStatus.TIMED_OUT
    assert not marker.exists(), "the timed-out agent process was killed"


def reports_through_the_proxy(task: Any, endpoint: Endpoint) -> None:
    emit_reward(0.75, name="graded")  # from the Ray worker: over OTLP to the proxy, which stores it


async def test_emit_reward_in_a_worker_reaches_the_proxy_store(proxy_server: Any) -> None:
    store = proxy_server.running_store()  # the proxy's own: one writer on its file in this process
    runner = _runner(reports_through_the_proxy, store, server=proxy_server.base_url, api_key=proxy_server.api_key)
    try:
        (outcome,) = await runner.run(["t"])
    finally:
        runner.close()
    assert outcome.status is RolloutStatus.SUCCEEDED, outcome.error
    rewards = [(r.name, r.value, r.attempt_id) async for r in store.iter_rewards(outcome.rollout_id)]
    (attempt,) = [a async for a in _attempts(proxy_server.store_path, outcome.rollout_id)]
    assert rewards == [("graded", 0.75, attempt)]


async def _attempts(path: Path, rollout_id: str) -> Any:
    async with SQLiteStore(path) as store:
        for attempt in await store.list_attempts(rollout_id):
            yield attempt.attempt_id
