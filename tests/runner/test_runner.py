"""The runner: groups, concurrency limit, rewards from returns, failures, timeouts, retries, commands."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path

import pytest

from agl_bridge.runner import (
    AgentCommand,
    AgentResultError,
    Endpoint,
    RetryPolicy,
    Runner,
    RunnerConfig,
    parse_reward_lines,
    rewards_of,
)
from agl_bridge.tracing import current_rollout
from agl_bridge.types import AttemptStatus, RolloutStatus

SERVER = "http://127.0.0.1:9"  # never contacted by these agents


def _runner(agent, store, **config) -> Runner:
    return Runner(agent, server_url=SERVER, api_key="sk-test", model="tiny", store=store, config=RunnerConfig(**config))


async def _rewards(store, rollout_id):
    return [(r.name, r.value, r.attempt_id) async for r in store.iter_rewards(rollout_id)]


async def test_groups_endpoints_and_returned_rewards(store) -> None:
    seen: list[tuple[object, Endpoint]] = []

    async def agent(task, endpoint):
        seen.append((task, endpoint))
        assert current_rollout().rollout_id == endpoint.rollout_id  # emit_reward would find it
        assert endpoint.api_key.startswith("agl-agent-") and current_rollout().api_key == "sk-test"
        return {"correct": 1.0, "format": 0.5} if task == "a" else 0.25

    runner = _runner(agent, store, group_size=3)
    outcomes = await runner.run(["a", "b"], group_prefix="step7")
    runner.close()
    assert [o.group_id for o in outcomes] == ["step7-0"] * 3 + ["step7-1"] * 3
    assert all(o.status is RolloutStatus.SUCCEEDED and o.attempts == 1 for o in outcomes)
    assert len({o.rollout_id for o in outcomes}) == 6
    for _task, endpoint in seen:
        assert endpoint.base_url == f"{SERVER}/rollout/{endpoint.rollout_id}/attempt/{endpoint.attempt_id}/v1"
    first = outcomes[0]
    assert sorted(r[:2] for r in await _rewards(store, first.rollout_id)) == [("correct", 1.0), ("format", 0.5)]
    assert [r[:2] for r in await _rewards(store, outcomes[3].rollout_id)] == [("reward", 0.25)]
    assert (await store.get_rollout(first.rollout_id)).group_id == "step7-0"


async def test_concurrency_limit_is_respected(store) -> None:
    running, peak = 0, 0

    async def agent(task, endpoint):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.02)
        running -= 1

    runner = _runner(agent, store, concurrency=3)
    await runner.run(range(12))
    runner.close()
    assert peak == 3


async def test_failures_are_recorded_with_traceback_and_retried(store) -> None:
    calls = 0

    async def flaky(task, endpoint):
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("transient")
        return 1.0

    runner = _runner(flaky, store, retry=RetryPolicy(max_attempts=3))
    (outcome,) = await runner.run(["t"])
    runner.close()
    assert outcome.status is RolloutStatus.SUCCEEDED and outcome.attempts == 2
    first, second = await store.list_attempts(outcome.rollout_id)
    assert first.status is AttemptStatus.FAILED and "RuntimeError: transient" in first.error
    assert "raise RuntimeError" in first.traceback
    assert second.status is AttemptStatus.SUCCEEDED
    assert [r[2] for r in await _rewards(store, outcome.rollout_id)] == [second.attempt_id]


async def test_hanging_agents_time_out_and_exhaust_retries(store) -> None:
    async def hangs(task, endpoint):
        await asyncio.sleep(60)

    release = threading.Event()

    def hangs_sync(task, endpoint):
        release.wait(30)

    runner = _runner(hangs, store, timeout_s=0.2, retry=RetryPolicy(max_attempts=2))
    sync_runner = _runner(hangs_sync, store, timeout_s=0.2)
    started = time.monotonic()
    (outcome,) = await runner.run(["t"])
    (sync_outcome,) = await sync_runner.run(["t"])
    release.set()
    runner.close(), sync_runner.close()
    assert time.monotonic() - started < 5
    assert outcome.status is RolloutStatus.TIMED_OUT and outcome.attempts == 2
    assert sync_outcome.status is RolloutStatus.TIMED_OUT
    attempts = await store.list_attempts(outcome.rollout_id)
    assert [a.status for a in attempts] == [AttemptStatus.TIMED_OUT] * 2
    assert "within 0.2s" in attempts[0].error


async def test_no_retry_when_policy_excludes_the_outcome(store) -> None:
    async def fails(task, endpoint):
        raise ValueError("bad task")

    runner = _runner(fails, store, retry=RetryPolicy(max_attempts=3, retry_on=frozenset({AttemptStatus.TIMED_OUT})))
    (outcome,) = await runner.run(["t"])
    runner.close()
    assert outcome.status is RolloutStatus.FAILED and outcome.attempts == 1


async def test_a_bad_return_value_fails_the_attempt_clearly(store) -> None:
    runner = _runner(lambda task, endpoint: float("nan"), store)
    (outcome,) = await runner.run(["t"])
    runner.close()
    assert outcome.status is RolloutStatus.FAILED
    assert "finite number" in outcome.error


def test_rewards_of() -> None:
    assert rewards_of(None) == {}
    assert rewards_of(2) == {"reward": 2.0}
    assert rewards_of({"a": 1, "b": -0.5}) == {"a": 1.0, "b": -0.5}
    for bad in ("1.0", True, float("inf"), {"a": "x"}):
        with pytest.raises(AgentResultError):
            rewards_of(bad)


def test_reward_lines() -> None:
    assert parse_reward_lines("hello\nagl-reward: 1.5\nagl-reward format: -1\nagl-reward: 2\n") == {
        "reward": 2.0,
        "format": -1.0,
    }


async def test_agent_command_gets_its_environment_and_reports_rewards(store, tmp_path: Path) -> None:
    script = tmp_path / "agent.py"
    script.write_text(
        "import json, os\n"
        "task = json.loads(os.environ['AGL_TASK'])\n"
        "route = f\"/rollout/{os.environ['AGL_ROLLOUT_ID']}/attempt/{os.environ['AGL_ATTEMPT_ID']}/v1\"\n"
        "assert os.environ['OPENAI_BASE_URL'].endswith(route)\n"
        "key = os.environ['OPENAI_API_KEY']\n"
        "assert key == os.environ['AGL_API_KEY'] and key.startswith('agl-agent-')\n"
        "assert 'sk-test' not in os.environ.values()  # never the operator key\n"
        "assert os.environ['AGL_ENDPOINT'] == 'http://127.0.0.1:9' and os.environ['AGL_MODEL'] == 'tiny'\n"
        "print('agl-reward:', task['n'] * 2)\n"
    )
    runner = _runner(AgentCommand([sys.executable, str(script)]), store)
    (outcome,) = await runner.run([{"n": 21}])
    runner.close()
    assert outcome.status is RolloutStatus.SUCCEEDED, outcome.error
    assert outcome.rewards == {"reward": 42.0}


async def test_agent_command_failure_and_timeout(store, tmp_path: Path) -> None:
    failing = AgentCommand([sys.executable, "-c", "import sys; print('oops', file=sys.stderr); sys.exit(3)"])
    runner = _runner(failing, store)
    (outcome,) = await runner.run(["t"])
    runner.close()
    assert outcome.status is RolloutStatus.FAILED
    assert "exited with status 3" in outcome.error and "oops" in outcome.error

    marker = tmp_path / "child-alive"
    hanging = AgentCommand(
        [
            sys.executable,
            "-c",
            f"import time, pathlib; time.sleep(0.5); pathlib.Path({str(marker)!r}).write_text('x'); time.sleep(60)",
        ]
    )
    runner = _runner(hanging, store, timeout_s=0.2)
    (outcome,) = await runner.run(["t"])
    runner.close()
    await asyncio.sleep(0.8)
    assert outcome.status is RolloutStatus.TIMED_OUT
    assert not marker.exists(), "the timed-out agent process was killed"
