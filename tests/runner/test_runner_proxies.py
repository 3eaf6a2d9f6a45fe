"""A runner over several proxies on one store: how attempts spread, and the check of each extra proxy.

The spread is tested on its own; the runs use real proxy subprocesses (`agl_bridge.testing.serve`,
instant sampler) on one SQLite file — the runner's own proxy and an extra one — plus one on
another file: calls and rewards land in the runner's store under the right attempts whichever
proxy served them, and an extra proxy that is on another store, refuses the key, serves another
model or is down stops the run with a `ConfigError` naming it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agl_bridge.errors import ConfigError
from agl_bridge.runner import Endpoint, ProxyAddress, Runner, RunnerConfig
from agl_bridge.runner.proxies import ProxySpread
from agl_bridge.store import SQLiteStore
from agl_bridge.testing.proxy_process import ProxyProcess, start_proxy
from agl_bridge.tracing import emit_reward, set_reward_sink
from agl_bridge.types import AttemptStatus, RolloutOrigin, RolloutStatus


def test_each_attempt_goes_to_the_proxy_with_the_fewest_in_flight() -> None:
    own, a, b = (ProxyAddress(f"http://127.0.0.1:{port}/", "k") for port in (4000, 4001, 4002))
    spread = ProxySpread(own, [a, b], model="tiny")
    assert own.url == "http://127.0.0.1:4000"
    taken = [spread.take() for _ in range(3)]
    assert sorted(p.url for p in taken) == sorted(p.url for p in (own, a, b))
    spread.release(taken[1])
    assert spread.take() == taken[1], "the only proxy with a free slot"
    for proxy in taken:
        spread.release(proxy)
    # All idle: ties are taken in turn, so sequential attempts still visit every proxy.
    visited = []
    for _ in range(6):
        proxy = spread.take()
        visited.append(proxy.url)
        spread.release(proxy)
    assert {url: visited.count(url) for url in visited} == {own.url: 2, a.url: 2, b.url: 2}
    with pytest.raises(ConfigError, match="must differ"):
        ProxySpread(own, [ProxyAddress("http://127.0.0.1:4000", "k")], model="tiny")


@pytest.fixture(scope="module")
def proxies(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ProxyProcess]]:
    """Two proxies on `shared.sqlite` (the runner's own and an extra one) and one on `other.sqlite`."""
    folder = tmp_path_factory.mktemp("runner_proxies")
    started: dict[str, ProxyProcess] = {}
    try:
        started["own"] = start_proxy(folder / "shared.sqlite", tiny_model_dir, api_key="sk-own")
        started["extra"] = start_proxy(folder / "shared.sqlite", tiny_model_dir, api_key="sk-extra")
        started["elsewhere"] = start_proxy(folder / "other.sqlite", tiny_model_dir, api_key="sk-else")
        yield started
    finally:
        for proxy in started.values():
            proxy.stop()


def _runner(agent: Any, store: SQLiteStore, proxies: dict[str, ProxyProcess], *extra: ProxyAddress, **config: Any):
    own = proxies["own"]
    return Runner(
        agent,
        server_url=own.base_url,
        api_key=own.api_key,
        model="tiny",
        store=store,
        config=RunnerConfig(**config),
        extra_proxies=extra,
    )


def _address(proxy: ProxyProcess, key: str | None = None) -> ProxyAddress:
    return ProxyAddress(proxy.base_url, key or proxy.api_key)


@pytest.mark.slow
async def test_attempts_on_either_proxy_record_their_calls_and_rewards_in_the_runners_store(
    proxies: dict[str, ProxyProcess],
) -> None:
    served_by: dict[tuple[str, str], str] = {}

    def agent(task: int, endpoint: Endpoint) -> None:
        client = endpoint.openai_client(max_retries=0)
        client.chat.completions.create(
            model=endpoint.model, messages=[{"role": "user", "content": f"task {task}"}], max_tokens=4
        )
        served_by[(endpoint.rollout_id, endpoint.attempt_id)] = endpoint.server_url
        emit_reward(float(task))  # delivered to this attempt's proxy, which records into the shared store

    # Over HTTP to the attempt's proxy: no in-process store (another test's proxy) takes the rewards instead.
    in_process = set_reward_sink(None)
    async with SQLiteStore(proxies["own"].store) as store:
        runner = _runner(agent, store, proxies, _address(proxies["extra"]), group_size=2, concurrency=4)
        try:
            outcomes = await runner.run([1, 2, 3], group_prefix="spread")
        finally:
            runner.close()
            set_reward_sink(in_process)
        assert [o.status for o in outcomes] == [RolloutStatus.SUCCEEDED] * 6, [o.error for o in outcomes]
        assert set(served_by.values()) == {proxies["own"].base_url, proxies["extra"].base_url}
        for outcome in outcomes:
            (attempt,) = await store.list_attempts(outcome.rollout_id)
            key = (outcome.rollout_id, attempt.attempt_id)
            calls = [c async for c in store.iter_llm_calls(*key)]
            rewards = [r.value async for r in store.iter_rewards(*key)]
            assert len(calls) == 1 and calls[0].response_token_ids, (key, served_by[key])
            assert rewards == [float(outcome.task)], (key, served_by[key])
        ours = {(o.rollout_id, a.attempt_id) for o in outcomes for a in await store.list_attempts(o.rollout_id)}
        recorded = {(c.rollout_id, c.attempt_id) async for c in store.iter_all_calls()}
        recorded |= {(r.rollout_id, r.attempt_id) async for r in store.iter_all_rewards()}
        rollouts = {rollout_id for rollout_id, _ in ours}
        assert {key for key in recorded if key[0] in rollouts} == ours, (
            "a record under an attempt the runner did not run"
        )


async def _refused_run(store: SQLiteStore, proxies: dict[str, ProxyProcess], extra: ProxyAddress, **runner: Any):
    """Run two rollouts one at a time (the first on the runner's own proxy, the second on `extra`); the error."""

    def agent(task: int, endpoint: Endpoint) -> None:
        endpoint.openai_client(max_retries=0).chat.completions.create(
            model=endpoint.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )

    made = Runner(
        agent,
        server_url=proxies["own"].base_url,
        api_key=proxies["own"].api_key,
        model=runner.get("model", "tiny"),
        store=store,
        config=RunnerConfig(group_size=2, concurrency=1),
        extra_proxies=[extra],
    )
    try:
        with pytest.raises(ConfigError) as refused:
            await made.run([0], group_prefix="refused")
    finally:
        made.close()
    return refused.value


@pytest.mark.slow
async def test_an_extra_proxy_on_another_store_stops_the_run_and_leaves_nothing_running_there(
    proxies: dict[str, ProxyProcess],
) -> None:
    async with SQLiteStore(proxies["own"].store) as store:
        error = await _refused_run(store, proxies, _address(proxies["elsewhere"]))
        assert f"the extra proxy {proxies['elsewhere'].base_url} records into another store" in str(error)
        failed = [r for r in await store.list_rollouts() if r.status is RolloutStatus.FAILED]
        attempts = {r.rollout_id: await store.list_attempts(r.rollout_id) for r in failed}
        probe = next(r for r in failed if "another store" in (attempts[r.rollout_id][0].error or ""))
        assert [a.status for a in attempts[probe.rollout_id]] == [AttemptStatus.FAILED]
    async with SQLiteStore(proxies["elsewhere"].store) as other:
        stray = await other.get_rollout(probe.rollout_id)
        assert stray is not None and stray.origin is RolloutOrigin.EXTERNAL
        assert stray.status is RolloutStatus.FAILED, "the probe registered there is finished, not left running"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("wrong key", "refused the key (HTTP 401): set proxy_api_key"),
        ("other model", "not the run's model 'other'"),
        ("down", "cannot be reached"),
    ],
)
async def test_an_unfit_extra_proxy_is_named_with_what_to_do(
    proxies: dict[str, ProxyProcess], case: str, message: str
) -> None:
    extra = {
        "wrong key": _address(proxies["extra"], "sk-wrong"),
        "other model": _address(proxies["extra"]),
        "down": ProxyAddress("http://127.0.0.1:9", "k"),
    }[case]
    async with SQLiteStore(proxies["own"].store) as store:
        error = await _refused_run(store, proxies, extra, **({"model": "other"} if case == "other model" else {}))
    assert extra.url in str(error) and message in str(error)
