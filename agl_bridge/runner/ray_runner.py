"""`RayRunner`: the runner with each attempt run as a Ray task (`runner = "ray"`), on a local or remote Ray cluster.

The semantics are the local runner's (`runner.py`): the driver (this process) creates the rollouts,
starts and finishes each attempt in the store, holds at most `concurrency` attempts in flight, and
retries failed and timed-out attempts per the policy. Only the agent itself runs in the Ray task:
an agent function (sync, in a thread of the worker; or async) or an `AgentCommand` (its process
started by the worker), inside `rollout_context`, so `emit_reward` in the worker reaches the proxy
over OTLP/HTTP. The task enforces the per-attempt timeout itself (a command is killed, as
locally); the driver cancels a task that does not answer `_GRACE_S` later (`ray.cancel(force=True)`
ends its worker process).

Ray's own task retries are off (`max_retries=0`): a worker that dies (killed, out of memory, its
node lost) fails that attempt with the reason, and the retry policy decides, as for any failure,
so every retry is a new attempt in the store. The agent, its task and the endpoint travel to the
worker by (cloud)pickle: agent functions must be importable there or defined in `__main__`.
Ray is an optional dependency (`pip install 'agl-bridge[ray]'`), imported when a RayRunner is made.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Sequence
from typing import Any

from agl_bridge.runner.command import AgentCommand
from agl_bridge.runner.endpoint import Endpoint
from agl_bridge.runner.proxies import ProxyAddress
from agl_bridge.runner.runner import AgentFunction, Runner, RunnerConfig, _AttemptResult, rewards_of
from agl_bridge.store.base import Store
from agl_bridge.tracing import RolloutContext, rollout_context
from agl_bridge.types import AttemptStatus

_GRACE_S = 30.0
"""How long past the attempt's timeout the driver waits for the task to report it before killing it."""


def _missing_ray() -> ImportError:
    return ImportError(
        'runner = "ray" needs Ray: pip install "agl-bridge[ray]" (or pip install ray) in this environment, '
        'or use the local runner (leave runner unset or "local")'
    )


class RayRunner(Runner):
    """A `Runner` whose attempts run as Ray tasks; the store is written by the driver only.

    ray_address: the cluster to join (`ray.init(address=...)`, e.g. "ray://head:10001" or "auto");
      None: the cluster this process already joined, else a local one started here (and shut down
      by `close`).
    task_options: `ray.remote` options of each attempt's task (default: `num_cpus=1`).
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
        ray_address: str | None = None,
        task_options: dict[str, Any] | None = None,
        extra_proxies: Sequence[ProxyAddress] = (),
    ) -> None:
        super().__init__(
            agent,
            server_url=server_url,
            api_key=api_key,
            model=model,
            store=store,
            config=config,
            extra_proxies=extra_proxies,
        )
        try:
            import ray
        except ImportError:
            raise _missing_ray() from None
        self._ray = ray
        self._started_ray = False
        if not ray.is_initialized():
            ray.init(address=ray_address, include_dashboard=False, log_to_driver=True)
            self._started_ray = True
        options = {"num_cpus": 1, **(task_options or {}), "max_retries": 0}
        self._task = ray.remote(**options)(run_attempt_in_worker)

    def close(self) -> None:
        """Release the runner's threads, and the local Ray cluster if this runner started it."""
        super().close()
        if self._started_ray:
            self._ray.shutdown()
            self._started_ray = False

    async def _run_attempt(self, task: Any, endpoint: Endpoint) -> _AttemptResult:
        from ray import exceptions as ray_errors

        timeout_s = self.config.timeout_s
        ref = self._task.remote(self.agent, task, endpoint, timeout_s)
        try:
            future = asyncio.wrap_future(ref.future())
            returned = await asyncio.wait_for(future, None if timeout_s is None else timeout_s + _GRACE_S)
            return _AttemptResult(AttemptStatus.SUCCEEDED, rewards=rewards_of(returned))
        except TimeoutError:
            self._ray.cancel(ref, force=True)
            message = f"the agent's Ray task gave no answer within {timeout_s:g}s + {_GRACE_S:g}s; it was killed"
            return _AttemptResult(AttemptStatus.TIMED_OUT, error=message)
        except ray_errors.RayTaskError as error:  # the agent raised (or timed out) in the worker
            cause = error.cause if isinstance(error.cause, BaseException) else error
            if isinstance(cause, TimeoutError):
                message = f"the agent gave no result within {timeout_s:g}s (RunnerConfig.timeout_s)"
                return _AttemptResult(AttemptStatus.TIMED_OUT, error=message)
            return _AttemptResult(AttemptStatus.FAILED, error=f"{type(cause).__name__}: {cause}", traceback=str(error))
        except ray_errors.RayError as error:  # the worker or its node died, the task was cancelled, ...
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            return _AttemptResult(
                AttemptStatus.FAILED,
                error=f"the Ray task running this attempt failed: {type(error).__name__}: {reason}",
            )
        except Exception as error:  # the agent's return value is not a reward
            return _AttemptResult(AttemptStatus.FAILED, error=f"{type(error).__name__}: {error}")


def run_attempt_in_worker(
    agent: AgentFunction | AgentCommand, task: Any, endpoint: Endpoint, timeout_s: float | None
) -> Any:
    """The body of an attempt's Ray task: run the agent in its rollout context within the timeout; its return value.

    `emit_reward` delivers to the attempt's proxy (`endpoint.server_url`), which records into the run's store.
    """
    context = RolloutContext(
        endpoint.rollout_id, endpoint.attempt_id, endpoint=endpoint.server_url, api_key=endpoint.reward_key
    )

    async def invoke() -> Any:
        if isinstance(agent, AgentCommand):
            return await agent.run(task, endpoint)
        if inspect.iscoroutinefunction(agent) or inspect.iscoroutinefunction(getattr(agent, "__call__", None)):  # noqa: B004
            return await agent(task, endpoint)
        returned = await asyncio.to_thread(agent, task, endpoint)  # copies the rollout context into the thread
        return await returned if inspect.isawaitable(returned) else returned

    async def bounded() -> Any:
        with rollout_context(context):
            return await asyncio.wait_for(invoke(), timeout_s)

    return asyncio.run(bounded())
