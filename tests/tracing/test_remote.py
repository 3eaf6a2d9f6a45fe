"""The remote path end to end: emit_reward → OTLP/HTTP exporter → uvicorn receiver → SQLiteStore.

Covers the same process (env and context), a subprocess agent configured only by environment
variables, the API key header, the global TracerProvider seeing the reward span, and failures.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

import pytest
from fastapi import Depends, HTTPException, Request
from shared_helpers import REPO, collect, free_port
from tracing_helpers import ReceiverServer

from agl_bridge import emit_reward, emit_reward_async, semconv
from agl_bridge.tracing import RewardDeliveryError, rollout_context


def subprocess_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGL_", "OTEL_")) and k != "OPENAI_API_KEY"}
    env.update(extra)
    return env


def run_agent(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )


async def test_same_process_env_and_context_rewards_arrive_in_order(
    receiver: ReceiverServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(semconv.ENV_ROLLOUT_ID, "ro-env")
    monkeypatch.setenv(semconv.ENV_ATTEMPT_ID, "at-env")
    monkeypatch.setenv(semconv.ENV_ENDPOINT, receiver.url + "/v1")  # the OpenAI base_url form works too
    emit_reward(1.5)
    with rollout_context("ro-ctx", "at-ctx", endpoint=receiver.url):
        emit_reward(0.25, name="format")
        await emit_reward_async(0.5, name="answer")
    emit_reward(2.5, name="final")
    async with receiver.reader() as reader:
        env_rewards = await collect(reader.iter_rewards("ro-env", "at-env"))
        ctx_rewards = await collect(reader.iter_rewards("ro-ctx", "at-ctx"))
    assert [(r.name, r.value) for r in env_rewards] == [("reward", 1.5), ("final", 2.5)]
    assert env_rewards[0].sequence < env_rewards[1].sequence
    assert [(r.name, r.value) for r in ctx_rewards] == [("format", 0.25), ("answer", 0.5)]
    assert ctx_rewards[0].sequence < ctx_rewards[1].sequence


async def test_each_reward_is_committed_before_emit_reward_returns(receiver: ReceiverServer) -> None:
    with rollout_context("ro-1", "at-1", endpoint=receiver.url):
        async with receiver.reader() as reader:
            for step in range(3):
                emit_reward(float(step))
                # No waiting, no flushing: the reward is already readable by another connection.
                assert [r.value for r in await collect(reader.iter_rewards("ro-1", "at-1"))] == [
                    float(i) for i in range(step + 1)
                ]


async def test_endpoint_may_be_the_per_rollout_base_url(receiver: ReceiverServer) -> None:
    # The runner may hand the agent its per-rollout OpenAI base URL; rewards post under that prefix.
    base_url = f"{receiver.url}/rollout/ro-u/attempt/at-u/v1"
    with rollout_context("ro-u", "at-u", endpoint=base_url):
        emit_reward(3.0)
    async with receiver.reader() as reader:
        assert [(r.rollout_id, r.attempt_id, r.value) for r in await collect(reader.iter_rewards("ro-u"))] == [
            ("ro-u", "at-u", 3.0)
        ]


def test_subprocess_agent_configured_by_env(receiver: ReceiverServer) -> None:
    env = subprocess_env(
        **{semconv.ENV_ROLLOUT_ID: "ro-sub", semconv.ENV_ATTEMPT_ID: "at-sub", semconv.ENV_ENDPOINT: receiver.url}
    )
    result = run_agent("from agl_bridge import emit_reward; emit_reward(1.5)", env)
    assert result.returncode == 0, result.stderr

    async def read() -> list[Any]:
        async with receiver.reader() as reader:
            return await collect(reader.iter_rewards("ro-sub"))

    rewards = asyncio.run(read())
    assert [(r.rollout_id, r.attempt_id, r.name, r.value) for r in rewards] == [("ro-sub", "at-sub", "reward", 1.5)]


def test_subprocess_without_rollout_fails_loudly() -> None:
    result = run_agent("from agl_bridge import emit_reward; emit_reward(1.5)", subprocess_env())
    assert result.returncode != 0
    assert "NoRolloutError" in result.stderr and semconv.ENV_ROLLOUT_ID in result.stderr


@pytest.mark.slow
def test_global_provider_sees_the_reward_span_and_the_store_gets_the_same_span(receiver: ReceiverServer) -> None:
    code = f"""
        import json
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        seen = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(seen))  # e.g. agentops' processor
        trace.set_tracer_provider(provider)

        from agl_bridge import emit_reward
        with trace.get_tracer("agent").start_as_current_span("agent.run") as run:
            emit_reward(2.0, name="acc")
        (reward,) = [s for s in seen.get_finished_spans() if s.name == {semconv.SPAN_REWARD!r}]
        print(json.dumps({{
            "span_id": format(reward.context.span_id, "016x"),
            "parent": format(reward.parent.span_id, "016x"),
            "run": format(run.get_span_context().span_id, "016x"),
            "rollout": reward.attributes[{semconv.AGL_ROLLOUT_ID!r}],
        }}))
    """
    env = subprocess_env(**{semconv.ENV_ROLLOUT_ID: "ro-long-rollout-id", semconv.ENV_ENDPOINT: receiver.url})
    result = run_agent(code, env)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["parent"] == seen["run"] and seen["rollout"] == "ro-long-rollout-id"

    async def read() -> list[Any]:
        async with receiver.reader() as reader:
            return await collect(reader.iter_rewards("ro-long-rollout-id"))

    (stored,) = asyncio.run(read())
    assert stored.span_id == seen["span_id"] and (stored.name, stored.value) == ("acc", 2.0)

    # With attribute values cut to 4 characters by the global provider, its span would carry
    # "ro-l"; the reward must still land under the full rollout id.
    result = run_agent(code, {**env, "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "4"})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["rollout"] == "ro-l"
    assert len(asyncio.run(read())) == 2


def require_bearer(expected: str) -> Any:
    def check(request: Request) -> None:
        if request.headers.get("authorization") != f"Bearer {expected}":
            raise HTTPException(status_code=401, detail="invalid api key")

    return Depends(check)


async def test_api_key_is_sent_as_bearer_and_a_refusal_is_a_delivery_error(
    make_receiver: Callable[..., ReceiverServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    guarded = make_receiver(dependencies=[require_bearer("sk-good")])
    monkeypatch.setenv(semconv.ENV_OPENAI_API_KEY, "sk-good")  # the key the agent already has
    with rollout_context("ro-1", "at-1", endpoint=guarded.url):
        emit_reward(1.0)
        with rollout_context("ro-1", "at-1", endpoint=guarded.url, api_key="sk-bad"):
            with pytest.raises(RewardDeliveryError) as info:
                emit_reward(2.0)
    message = str(info.value)
    assert f"{guarded.url}/v1/traces" in message and "401" in message and "not recorded" in message
    async with guarded.reader() as reader:
        assert [r.value for r in await collect(reader.iter_rewards("ro-1"))] == [1.0]


async def test_unreachable_endpoint_is_a_delivery_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(semconv.ENV_REWARD_TIMEOUT_S, "1")
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with rollout_context("ro-1", endpoint=url):
        with pytest.raises(RewardDeliveryError, match=f"{url}/v1/traces"):
            emit_reward(1.0)
        with pytest.raises(RewardDeliveryError, match="is running"):
            await emit_reward_async(1.0)
    assert time.monotonic() - started < 10


def test_a_proxy_that_does_not_answer_in_time_points_to_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(semconv.ENV_REWARD_TIMEOUT_S, "0.5")
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts connections, never answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with rollout_context("ro-1", endpoint=url), pytest.raises(RewardDeliveryError) as info:
            emit_reward(1.0)
    message = str(info.value)
    assert "within 0.5 s" in message and f"raise {semconv.ENV_REWARD_TIMEOUT_S}" in message
    assert "not recorded" in message


def test_bad_timeout_setting_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(semconv.ENV_REWARD_TIMEOUT_S, "soon")
    with rollout_context("ro-1", endpoint="http://127.0.0.1:9"):
        with pytest.raises(ValueError, match=f"{semconv.ENV_REWARD_TIMEOUT_S}.*positive number"):
            emit_reward(1.0)
