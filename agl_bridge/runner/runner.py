"""Running an agent over tasks × group_size rollouts against a proxy, with limits and retries.

The agent is an ordinary function `agent(task, endpoint)` — sync or async — or an `AgentCommand`
(any executable). It talks to the model through `endpoint.base_url` (already routed to its rollout
attempt) and reports rewards with `emit_reward`, or by returning a number (or a dict of named
numbers). Each attempt is recorded in the store: started, then succeeded, failed (with the
exception's traceback) or timed out; failed and timed-out attempts are retried per the policy and
never trained on.

A sync agent runs in a worker thread; on timeout its attempt is marked timed out at once, but the
thread cannot be killed and runs on in the background (its late calls land in the timed-out
attempt, which is never trained). An `AgentCommand` is killed on timeout.

With `extra_proxies` (other proxies recording into the same store), each attempt talks to one of
them or to `server_url`'s, whichever has the fewest attempts in flight (`proxies.py`).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import math
import traceback
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

from agl_bridge.agent_keys import AgentKeys
from agl_bridge.errors import ConfigError
from agl_bridge.runner.command import AgentCommand
from agl_bridge.runner.endpoint import Endpoint
from agl_bridge.runner.proxies import ProxyAddress, ProxySpread
from agl_bridge.store.base import Store
from agl_bridge.tracing import RolloutContext, rollout_context
from agl_bridge.types import AttemptStatus, Reward, RolloutStatus

AgentFunction = Callable[[Any, Endpoint], Any]

AGENT_KEY_GRACE_S = 600.0
"""How long past its attempt's timeout an agent key stays valid (clock skew between runner and proxies, a slow
last answer)."""


class AgentResultError(ValueError):
    """An agent returned something that is not a reward."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often a rollout is tried, and after which outcomes it is tried again."""

    max_attempts: int = 1
    retry_on: frozenset[AttemptStatus] = frozenset({AttemptStatus.FAILED, AttemptStatus.TIMED_OUT})

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")


@dataclass(frozen=True)
class RunnerConfig:
    """group_size rollouts per task; at most `concurrency` attempts at once; `timeout_s` per attempt."""

    group_size: int = 1
    concurrency: int = 8
    timeout_s: float | None = 300.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {self.timeout_s}")


@dataclass
class RolloutOutcome:
    """How one rollout ended: its final status, attempts made, rewards returned, last error, and when
    its final status was written (the rollout's `updated_at`, epoch seconds)."""

    rollout_id: str
    group_id: str
    task: Any
    status: RolloutStatus
    attempts: int
    rewards: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    finished_at: float = 0.0


@dataclass
class _AttemptResult:
    status: AttemptStatus
    rewards: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    traceback: str | None = None


class Runner:
    """Runs an agent over task groups against a proxy (or several on one store), recording into a store.

    server_url / api_key: the proxy beside `store` (a training run's own); extra_proxies: more proxies
    recording into the same store, each checked before its first attempt (`proxies.py`).
    """

    def __init__(
        self,
        agent: AgentFunction | AgentCommand,
        *,
        server_url: str,
        api_key: str,
        model: str,
        store: Store,
        config: RunnerConfig | None = None,
        extra_proxies: Iterable[ProxyAddress] = (),
    ) -> None:
        self.agent = agent
        self.server_url = server_url.rstrip("/")
        self.api_key = api_key
        self.model = model
        self.store = store
        self.config = config or RunnerConfig()
        self.proxies = ProxySpread(ProxyAddress(self.server_url, api_key), list(extra_proxies), model=model)
        # The default executor has few threads; sync agents need one each up to the concurrency.
        self._threads = ThreadPoolExecutor(max_workers=self.config.concurrency + 4, thread_name_prefix="agl-agent")

    def close(self) -> None:
        """Release the worker threads (threads of timed-out sync agents are not waited for)."""
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def run(self, tasks: Iterable[Any], *, group_prefix: str | None = None) -> list[RolloutOutcome]:
        """Run every task `group_size` times; rollouts of one task share a group id."""
        prefix = group_prefix or f"g-{uuid.uuid4().hex[:8]}"
        # Created together, so that the store commits them in one transaction rather than one by one.
        rollouts = await asyncio.gather(
            *(
                self.store.create_rollout(task, group_id=f"{prefix}-{index}")
                for index, task in enumerate(tasks)
                for _ in range(self.config.group_size)
            )
        )
        limit = asyncio.Semaphore(self.config.concurrency)
        # Every rollout was created with a group id just above.
        return list(
            await asyncio.gather(
                *(self._run_rollout(r.rollout_id, cast(str, r.group_id), r.task, limit) for r in rollouts)
            )
        )

    def endpoint(self, rollout_id: str, attempt_id: str, proxy: ProxyAddress | None = None) -> Endpoint:
        """The endpoint an agent gets for one attempt on `proxy` (default: the runner's own)."""
        proxy = proxy or self.proxies.proxies[0]
        # The agent's key expires a while after its attempt can last, so one leaked after the run opens nothing.
        ttl = None if self.config.timeout_s is None else self.config.timeout_s + AGENT_KEY_GRACE_S
        return Endpoint(
            base_url=f"{proxy.url}/rollout/{rollout_id}/attempt/{attempt_id}/v1",
            api_key=AgentKeys(proxy.api_key).mint(rollout_id, attempt_id, ttl_s=ttl),
            model=self.model,
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            server_url=proxy.url,
            harness_key=None if isinstance(self.agent, AgentCommand) else proxy.api_key,
        )

    async def _run_rollout(self, rollout_id: str, group_id: str, task: Any, limit: asyncio.Semaphore) -> RolloutOutcome:
        retry = self.config.retry
        for number in range(1, retry.max_attempts + 1):
            async with limit:
                attempt = await self.store.start_attempt(rollout_id)
                proxy = self.proxies.take()
                try:
                    try:
                        await self.proxies.check(proxy, rollout_id, attempt.attempt_id)
                    except ConfigError as error:  # a misconfigured extra proxy stops the run; this attempt ends
                        await self.store.finish_attempt(attempt.attempt_id, AttemptStatus.FAILED, error=str(error))
                        await self.store.set_rollout_status(rollout_id, RolloutStatus.FAILED)
                        raise
                    result = await self._run_attempt(task, self.endpoint(rollout_id, attempt.attempt_id, proxy))
                finally:
                    self.proxies.release(proxy)
                if result.rewards:
                    await self.store.add_rewards(
                        [
                            Reward(rollout_id=rollout_id, attempt_id=attempt.attempt_id, name=k, value=v)
                            for k, v in result.rewards.items()
                        ]
                    )
                await self.store.finish_attempt(
                    attempt.attempt_id, result.status, error=result.error, traceback=result.traceback
                )
            if (
                result.status is AttemptStatus.SUCCEEDED
                or result.status not in retry.retry_on
                or number == retry.max_attempts
            ):
                final = RolloutStatus(result.status.value)
                ended = await self.store.set_rollout_status(rollout_id, final)
                return RolloutOutcome(
                    rollout_id, group_id, task, final, number, result.rewards, result.error, ended.updated_at
                )
        raise AssertionError("unreachable: the last attempt always returns")

    async def _run_attempt(self, task: Any, endpoint: Endpoint) -> _AttemptResult:
        context = RolloutContext(
            endpoint.rollout_id, endpoint.attempt_id, endpoint=endpoint.server_url, api_key=endpoint.reward_key
        )
        try:
            with rollout_context(context):
                returned = await asyncio.wait_for(self._invoke(task, endpoint), self.config.timeout_s)
            return _AttemptResult(AttemptStatus.SUCCEEDED, rewards=rewards_of(returned))
        except TimeoutError:
            message = f"the agent gave no result within {self.config.timeout_s:g}s (RunnerConfig.timeout_s)"
            return _AttemptResult(AttemptStatus.TIMED_OUT, error=message)
        except Exception as error:
            return _AttemptResult(
                AttemptStatus.FAILED, error=f"{type(error).__name__}: {error}", traceback=traceback.format_exc()
            )

    async def _invoke(self, task: Any, endpoint: Endpoint) -> Any:
        if isinstance(self.agent, AgentCommand):
            return await self.agent.run(task, endpoint)
        if inspect.iscoroutinefunction(self.agent) or inspect.iscoroutinefunction(
            getattr(self.agent, "__call__", None)  # noqa: B004 (a callable object's async __call__)
        ):
            return await self.agent(task, endpoint)
        loop = asyncio.get_running_loop()
        returned = await loop.run_in_executor(self._threads, contextvars.copy_context().run, self.agent, task, endpoint)
        if inspect.isawaitable(returned):
            returned = await returned
        return returned


def rewards_of(returned: Any) -> dict[str, float]:
    """What an agent's return value says about rewards: a number, a dict of named numbers, or None."""
    if returned is None:
        return {}
    items = returned.items() if isinstance(returned, dict) else [("reward", returned)]
    rewards = {}
    for name, value in items:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise AgentResultError(
                f"the agent returned {returned!r}; return a finite number, a dict of named finite numbers, "
                "or None (and report rewards with emit_reward)"
            )
        rewards[str(name)] = float(value)
    return rewards


def run_rollouts(
    agent: AgentFunction | AgentCommand,
    tasks: Iterable[Any],
    *,
    server_url: str,
    api_key: str,
    model: str,
    store_path: str,
    config: RunnerConfig | None = None,
) -> list[RolloutOutcome]:
    """Run the agent from synchronous code: opens the store, runs all rollouts, closes the store."""
    from agl_bridge.store.location import store_at

    async def main() -> list[RolloutOutcome]:
        async with store_at(store_path) as store:
            runner = Runner(agent, server_url=server_url, api_key=api_key, model=model, store=store, config=config)
            try:
                return await runner.run(tasks)
            finally:
                runner.close()

    return asyncio.run(main())
