"""A whole run spread over processes on one machine: a hello-style agent's GRPO with its rollouts on local Ray,
talking to two proxies (the trainer's own and an `agl-bridge serve --sampler remote` of its own,
`proxy_urls`), sampling on a third process (another `serve`, the remote sampler both proxies use),
recording into PostgreSQL, converted from PostgreSQL.

Checked: the run trains (a policy version per step), both proxies served calls, nothing is lost
(every rollout has its attempts, each succeeded attempt its call and its reward — the reward
delivered by the agent's Ray worker to the proxy of its attempt), nothing is misattributed (every
stored call and reward belongs to an attempt the runner started; no rollout appears that the runner
did not create; each call's policy version is the one its step sampled with, on either proxy), and
the converter reading the PostgreSQL store gives a trajectory per succeeded attempt.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agl_bridge.convert import ConvertOptions, convert_store
from agl_bridge.store import PostgresStore
from agl_bridge.testing.agents import VARIED_REWARD_HELLO_AGENT
from agl_bridge.testing.proxy_process import ProxyProcess, child_env, start_proxy, start_remote_serve
from agl_bridge.types import AttemptStatus, RolloutOrigin

pytest.importorskip("ray", reason="the distributed run needs Ray: pip install 'agl-bridge[ray]'")
pytestmark = pytest.mark.slow


@pytest.fixture
def sampler_server(tiny_model_dir: Path, tmp_path: Path) -> Iterator[ProxyProcess]:
    """The remote sampler: another proxy process sampling with the tiny model, loading the run's adapters."""
    server = start_proxy(tmp_path / "sampler.db", tiny_model_dir, sampler="tiny")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def extra_proxy(
    sampler_server: ProxyProcess, postgres_dsn: str, tiny_model_dir: Path, tmp_path: Path
) -> Iterator[ProxyProcess]:
    """A proxy of its own on the run's store, sampling from the same server (its access log: extra.log)."""
    server = start_remote_serve(
        tiny_model_dir, postgres_dsn, sampler_server, api_key="sk-extra-proxy", log_path=tmp_path / "extra.log"
    )
    try:
        yield server
    finally:
        server.stop()


async def test_hello_grpo_on_ray_over_two_proxies_with_a_remote_sampler_and_a_postgresql_store(
    sampler_server: ProxyProcess, extra_proxy: ProxyProcess, postgres_dsn: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "agent.py").write_text(VARIED_REWARD_HELLO_AGENT)
    (tmp_path / "tasks.jsonl").write_text("".join(f"{n}\n" for n in (7, 42, 100, 321)))
    config = {
        "agent": f"{tmp_path / 'agent.py'}:agent",
        "tasks": "tasks.jsonl",
        "run_dir": str(tmp_path / "run"),
        "model": str(tiny_model_dir),
        "steps": 2,
        "batch_size": 2,
        "group_size": 2,
        "learning_rate": 3e-3,
        "default_max_tokens": 8,
        "tensorboard": False,
        "eval_every": 100,
        "checkpoint_every": 2,
        "store": postgres_dsn,
        "runner": "ray",
        "concurrency": 4,
        "sampler": "remote",
        "sampler_urls": [sampler_server.base_url],
        "sampler_api_key": sampler_server.api_key,
        "sampler_model": "tiny",
        "adapter_dir": str(tmp_path / "adapters"),
        "proxy_urls": [extra_proxy.base_url],
        "proxy_api_key": extra_proxy.api_key,
    }
    (tmp_path / "run.json").write_text(json.dumps(config))
    done = subprocess.run(
        [sys.executable, "-m", "agl_bridge.cli", "train", "--config", str(tmp_path / "run.json")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**child_env(), "COLUMNS": "200"},
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in records if r.get("phase") == "train"] == [1, 2]
    served_by_extra = set(_CHAT_ON_EXTRA.findall((tmp_path / "extra.log").read_text()))

    async with PostgresStore(postgres_dsn) as store:
        rollouts = await store.list_rollouts()
        assert len(rollouts) == 2 * 2 * 2 and all(r.origin is RolloutOrigin.RUNNER for r in rollouts)
        started: set[tuple[str, str]] = set()
        succeeded = 0
        on_extra: list[bool] = []
        for rollout in rollouts:
            attempts = await store.list_attempts(rollout.rollout_id)
            assert attempts, f"{rollout.rollout_id} has no attempt"
            started |= {(rollout.rollout_id, a.attempt_id) for a in attempts}
            for attempt in attempts:
                if attempt.status is AttemptStatus.SUCCEEDED:
                    succeeded += 1
                    calls = [c async for c in store.iter_llm_calls(rollout.rollout_id, attempt.attempt_id)]
                    rewards = [r async for r in store.iter_rewards(rollout.rollout_id, attempt.attempt_id)]
                    assert len(calls) == 1 and len(rewards) == 1, (rollout.rollout_id, calls, rewards)
                    # Step k's rollouts (group s<k>-…) sample with policy version k, whichever proxy served them.
                    step = int(str(rollout.group_id).split("-")[0][1:])
                    assert calls[0].policy_version == step, (rollout.rollout_id, rollout.rollout_id in served_by_extra)
                    on_extra.append(rollout.rollout_id in served_by_extra)
        recorded = {(c.rollout_id, c.attempt_id) async for c in store.iter_all_calls()}
        recorded |= {(r.rollout_id, r.attempt_id) async for r in store.iter_all_rewards()}
        assert recorded <= started, f"records outside the runner's attempts: {recorded - started}"
        trajectories = [t async for t in convert_store(store, options=ConvertOptions())]
    assert succeeded >= 6 and len(trajectories) == succeeded
    assert any(on_extra) and not all(on_extra), f"both proxies serve calls: {on_extra}"


# An access-log line of a chat call the extra proxy answered: its rollout id.
_CHAT_ON_EXTRA = re.compile(r"POST /v1/chat/completions rollout=(\S+) attempt=\S+ key=\S+ status=200")
