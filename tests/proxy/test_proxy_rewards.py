"""`emit_reward` against a running proxy: in-process (the proxy registers a store sink when it starts)
and from an agent subprocess (OTLP to the proxy), each ordered among the rollout's calls."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

import openai
import pytest
from proxy_helpers import MODEL, stored_calls, stored_rewards
from shared_helpers import ROLLOUT_ENV_VARS, new_id

from agl_bridge import emit_reward, semconv
from agl_bridge.tracing import emit_reward_async, rollout_context


@pytest.fixture(autouse=True)
def _no_rollout_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ROLLOUT_ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def _call(server: Any, rid: str, aid: str) -> None:
    with openai.OpenAI(base_url=server.openai_base_url(rid, aid), api_key=server.api_key, max_retries=0) as client:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"[{rid}]"}], max_tokens=2)


def test_reward_in_rollout_context_sorts_between_calls(proxy_server: Any) -> None:
    rid, aid = new_id("rw"), "at-1"
    _call(proxy_server, rid, aid)
    with rollout_context(rid, aid):
        emit_reward(0.5)
        emit_reward(2, name="format")
    _call(proxy_server, rid, aid)
    first, second = stored_calls(proxy_server, rid, aid)
    rewards = stored_rewards(proxy_server, rid, aid)
    assert [(r.name, r.value) for r in rewards] == [("reward", 0.5), ("format", 2.0)]
    assert all(r.rollout_id == rid and r.attempt_id == aid for r in rewards)
    assert first.sequence < rewards[0].sequence < rewards[1].sequence < second.sequence


def test_reward_with_explicit_ids_from_another_thread(proxy_server: Any) -> None:
    rid, aid = new_id("rwthread"), "at-2"
    _call(proxy_server, rid, aid)
    errors: list[BaseException] = []

    def agent() -> None:
        try:
            emit_reward(-1.25, rollout_id=rid, attempt_id=aid)
        except BaseException as error:  # reported in the test thread
            errors.append(error)

    thread = threading.Thread(target=agent)
    thread.start()
    thread.join(30)
    assert not errors
    (call,) = stored_calls(proxy_server, rid, aid)
    (reward,) = stored_rewards(proxy_server, rid, aid)
    assert reward.value == -1.25 and reward.sequence > call.sequence


async def test_async_reward_inside_rollout_context(proxy_server: Any) -> None:
    rid, aid = new_id("rwasync"), "at-3"
    base_url = proxy_server.openai_base_url(rid, aid)
    async with openai.AsyncOpenAI(base_url=base_url, api_key=proxy_server.api_key, max_retries=0) as client:
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"[{rid}]"}], max_tokens=2
        )
        with rollout_context(rid, aid):
            await emit_reward_async(1.0)
    (call,) = stored_calls(proxy_server, rid, aid)
    (reward,) = stored_rewards(proxy_server, rid, aid)
    assert reward.value == 1.0 and reward.sequence > call.sequence


_AGENT = """
import os, sys
from agl_bridge import emit_reward
emit_reward(1.0)
# The agent's per-rollout base URL also works as the endpoint.
os.environ["AGL_ENDPOINT"] = sys.argv[1]
emit_reward(0.25, name="bonus")
# A wrong key is refused, loudly.
os.environ["AGL_API_KEY"] = "sk-wrong"
try:
    emit_reward(9.0, name="never")
except Exception as error:
    print("REFUSED", type(error).__name__)
"""


def test_reward_from_an_agent_subprocess(proxy_server: Any, tmp_path: Any) -> None:
    rid, aid = new_id("rwproc"), "at-4"
    _call(proxy_server, rid, aid)
    env = {
        **os.environ,
        semconv.ENV_ROLLOUT_ID: rid,
        semconv.ENV_ATTEMPT_ID: aid,
        semconv.ENV_ENDPOINT: proxy_server.base_url,
        semconv.ENV_API_KEY: proxy_server.api_key,
        semconv.ENV_REWARD_TIMEOUT_S: "10",
    }
    done = subprocess.run(
        [sys.executable, "-c", _AGENT, proxy_server.openai_base_url(rid, aid)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "REFUSED RewardDeliveryError" in done.stdout, done.stdout + done.stderr
    _call(proxy_server, rid, aid)
    first, second = stored_calls(proxy_server, rid, aid)
    rewards = stored_rewards(proxy_server, rid, aid)
    assert [(r.name, r.value) for r in rewards] == [("reward", 1.0), ("bonus", 0.25)]
    assert first.sequence < rewards[0].sequence < rewards[1].sequence < second.sequence
