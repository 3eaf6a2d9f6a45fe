"""Follow mode: GRPO on the rollouts an outside harness sends, as they finish; the trainer runs no agent.

The harness (any program, any language) calls the proxy under `/rollout/{id}/attempt/{id}/v1`,
names each rollout's task (`POST .../start` or `.../finish` with `task_id`: the rollouts of one
task form a GRPO group), reports rewards and finishes its rollouts over HTTP. The trainer serves
that proxy itself (the in-process sampler's weights can only change in this process), or, with
`follow.store`, attaches to the store of a running `agl-bridge serve` and hands its weights to
that server (`sampler = "remote"`). Each step, reading top to bottom:

1. wait — until `batch_size` groups are complete (`follow_groups.ready_groups`). Each group is
   taken (marked consumed in the store with this step's number) and converted as soon as it is
   complete, so when the step's last group arrives only that one is left to convert. A group
   sampled by a policy more than `max_staleness` versions older than the one serving is dropped
   and counted; the truncated importance sampling of the loss corrects the rest. A trainer nobody
   calls waits on the store's change notification (never a busy loop) and says every
   `follow.wait_report_s` that it is waiting and what it has;
2. advantages, datums, train (`step.train_step`), sync (the new weights serve at once), log — with
   how stale the step's data was, and the time from the step's last finished rollout to its new
   weights serving;
3. evaluate — held-out rollouts the harness marks `eval` are never trained; once none of them is
   running, the mean return of those not yet reported is logged as an evaluation;
4. checkpoint — with the policy version and the run's start; `--resume` gives back what steps after
   the checkpoint had taken (`Store.release_consumed`), so no group trains twice and none is skipped.

Rollouts created before the run started (another run's, or sampled by older weights) are never
taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agl_bridge.convert import ConversionReport, Trajectory, convert_store
from agl_bridge.convert.records import merged_reports
from agl_bridge.primitives.client import TrainingClient
from agl_bridge.proxy.server import ProxyServer
from agl_bridge.store.base import Store
from agl_bridge.store.location import describe_location, store_at
from agl_bridge.train.advantages import AdvantageBatch, group_advantages
from agl_bridge.train.config import GRPOConfig
from agl_bridge.train.datums import batch_datums
from agl_bridge.train.evaluation import eval_record, rollout_return
from agl_bridge.train.follow_groups import ReadyGroup, WaitingCounts, ready_groups
from agl_bridge.train.loop_state import resume_latest, save_checkpoint
from agl_bridge.train.policy import open_policy
from agl_bridge.train.run_log import RunLog, RunSummary, format_reward, step_line
from agl_bridge.train.step import grpo_settings, train_step
from agl_bridge.train.step_record import Marks, step_record
from agl_bridge.train.warm_start import warm_start
from agl_bridge.types import Rollout, RolloutStatus

ENDPOINT_FILE = "endpoint.json"
"""Written to run_dir while the trainer serves: `{"base_url", "api_key"}` for harnesses to read (mode 0600)."""


@dataclass
class TakenGroup:
    """A complete group taken for the coming step: its rollouts, their trajectories, their oldest policy."""

    rollouts: list[Rollout]
    trajectories: list[Trajectory]
    report: ConversionReport
    staleness: int | None  # policy versions between the serving one and the group's oldest token


@dataclass
class StepBatch:
    """What one step trains on, gathered while waiting."""

    groups: list[TakenGroup] = field(default_factory=list)
    stale_groups: int = 0
    stale_rollouts: int = 0


def train_follow(config: GRPOConfig, log: RunLog, *, resume: bool, warm_start_pairs: list[Any]) -> RunSummary:
    """Run the follow mode for `config.steps` steps (module doc); with `resume`, from the last checkpoint."""
    started = time.monotonic()
    run_dir = Path(config.run_dir)
    follow = config.follow
    (run_dir / ENDPOINT_FILE).unlink(missing_ok=True)  # a crashed run's: the address of no server
    policy = open_policy(config)
    client, sampler = policy.client, policy.sampler
    proxy: ProxyServer | None = None
    try:
        state = resume_latest(client, run_dir, config.seed, log, sync=False) if resume else None
        if state is None and config.warm_start.steps > 0 and warm_start_pairs:
            asyncio.run(warm_start(client, policy.tokenizer, warm_start_pairs, config, log))
        # The served weights are the trainer's from here on (a server we attach to may hold another run's).
        version = int(state["policy_version"]) if state is not None else sampler.policy_version
        client.save_weights_and_get_sampling_client(version=version)
        store_path = follow.store or config.store_location(run_dir)
        if follow.store is None:
            proxy = policy.proxy(
                config,
                run_dir,
                host=follow.host,
                port=follow.port,
                api_key=follow.api_key,
                rollout_idle_timeout_s=follow.rollout_idle_timeout_s,
            ).start()
            _announce(proxy, run_dir, log)
        else:
            where = describe_location(store_path)
            log.say(f"following the store {where}; new weights go to {', '.join(config.sampler_urls)}")
        loop = FollowLoop(
            config,
            client,
            store_path,
            log,
            where=proxy.base_url if proxy else where,
            store=proxy.running_store() if proxy else None,
        )
        summary = asyncio.run(loop.run(state, version))
        client.save_weights_for_sampler(run_dir / "final_adapter")
    finally:
        if proxy is not None:
            (run_dir / ENDPOINT_FILE).unlink(missing_ok=True)  # harnesses must not find a server that is gone
            proxy.stop()
        policy.close()
    summary.wall_time_s = time.monotonic() - started
    return summary


def _announce(proxy: ProxyServer, run_dir: Path, log: RunLog) -> None:
    """Say where harnesses send their rollouts, and write it to run_dir/endpoint.json for them."""
    endpoint = run_dir / ENDPOINT_FILE
    fd = os.open(endpoint, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump({"base_url": proxy.base_url, "api_key": proxy.api_key}, file)
    log.say(
        f"serving {proxy.model_name!r} for your harness at {proxy.openai_base_url('ROLLOUT_ID', 'ATTEMPT_ID')} "
        f"(key in {endpoint}); lifecycle: POST {proxy.base_url}/rollout/ROLLOUT_ID/attempt/ATTEMPT_ID/"
        "start|reward|finish"
    )


class FollowLoop:
    """The follow loop over one store (module doc): wait for groups, train, sync, evaluate, checkpoint.

    store: the running proxy's store when the proxy serves in this process (used as is: one writer
    per store file in a process); None opens the store at `store_path` for the run.
    """

    def __init__(
        self,
        config: GRPOConfig,
        client: TrainingClient,
        store_path: str | Path,
        log: RunLog,
        *,
        where: str,
        store: Store | None = None,
    ):
        self.config = config
        self.client = client
        self.store_path = store_path
        self.store = store
        self.log = log
        self.where = where
        self.options = config.convert_options()
        self.summary = RunSummary(Path(config.run_dir), 0, 0.0, None, None)

    async def run(self, state: dict[str, Any] | None, version: int) -> RunSummary:
        """Steps from the checkpoint `state` (or from 0) until `config.steps`; the run's summary."""
        config = self.config
        settings = grpo_settings(config)
        first_step = 0 if state is None else int(state["next_step"])
        since = time.time() if state is None else float(state["since"])
        self.summary.eval_start = None if state is None else state.get("eval_start")
        async with self._opened_store() as store:
            if state is not None:
                released = await store.release_consumed(first_step)
                if released:
                    self.log.say(f"{released} rollouts taken by steps after the checkpoint are to be trained again")
            for step in range(first_step + 1, config.steps + 1):
                t0 = time.perf_counter()
                batch = await self._gather(store, step, since, version)
                t1 = time.perf_counter()
                trajectories = [t for group in batch.groups for t in group.trajectories]
                advantages = group_advantages(
                    trajectories, estimator=config.advantage, std_scaling=config.advantage_std_scaling
                )
                datums = batch_datums(
                    advantages,
                    aggregation=config.aggregation,
                    estimator=config.advantage,
                    budget=config.default_max_tokens,
                )
                t2 = time.perf_counter()
                metrics = await train_step(
                    self.client, datums, settings.at_learning_rate(config.learning_rate_at(step - 1))
                )
                t3 = time.perf_counter()
                if datums:
                    version = (
                        await self.client.save_weights_and_get_sampling_client_async(version=version + 1)
                    ).policy_version
                t4 = time.perf_counter()
                weights_at = time.time()
                self._log_step(
                    step, version, batch, trajectories, advantages, datums, metrics, (t0, t1, t2, t3, t4), weights_at
                )
                await self._evaluate(store, step, since)
                if step % config.checkpoint_every == 0 or step == config.steps:
                    extra = {"policy_version": version, "since": since}
                    save_checkpoint(
                        self.client, Path(config.run_dir), step, self.summary.eval_start, config.seed, self.log, extra
                    )
                self.summary.steps = step
            await self._evaluate(store, config.steps, since)
        return self.summary

    @contextlib.asynccontextmanager
    async def _opened_store(self) -> AsyncIterator[Store]:
        """The proxy's store when given, else the store at `store_path`, opened for the run."""
        if self.store is not None:
            yield self.store
            return
        async with store_at(self.store_path) as store:
            yield store

    async def _gather(self, store: Store, step: int, since: float, version: int) -> StepBatch:
        """Take complete groups (converting each at once) until the step has `batch_size` of them."""
        config, follow = self.config, self.config.follow
        batch = StepBatch()
        reported = time.monotonic()  # a step whose groups keep arriving says nothing; a wait says so
        while True:
            await self._evaluate(store, step - 1, since)  # held-out rollouts done under the last step's weights
            token = await store.change_token()  # before the read: a change after it wakes the wait below
            candidates = await store.list_rollouts(consumed=False, eval=False, created_since=since)
            now = time.time()
            ready, counts = ready_groups(
                candidates, config.group_size, follow.min_group_size, follow.group_timeout_s, now
            )
            for group in ready[: config.batch_size - len(batch.groups)]:
                taken = await self._take(store, group, step, version)
                if taken.staleness is not None and taken.staleness > config.max_staleness:
                    batch.stale_groups += 1
                    batch.stale_rollouts += len(taken.rollouts)
                    continue
                batch.groups.append(taken)
            if len(batch.groups) >= config.batch_size:
                return batch
            if time.monotonic() - reported >= follow.wait_report_s:
                self.log.say(_waiting_line(self.where, counts, len(batch.groups), config.batch_size, config.group_size))
                reported = time.monotonic()
            wake = follow.wait_report_s
            if counts.next_timeout_at is not None:
                wake = min(wake, max(0.05, counts.next_timeout_at - now))
            await store.wait_for_change(wake, since=token)

    async def _take(self, store: Store, group: ReadyGroup, step: int, version: int) -> TakenGroup:
        """Mark a complete group as taken by `step` and convert it; its staleness against `version`."""
        ids = [rollout.rollout_id for rollout in group.rollouts]
        await store.mark_consumed(ids, step)
        report = ConversionReport()
        trajectories = [t async for t in convert_store(store, rollout_ids=ids, options=self.options, report=report)]
        versions = [v for t in trajectories for s in t.segments for v in s.policy_versions if v >= 0]
        return TakenGroup(group.rollouts, trajectories, report, version - min(versions) if versions else None)

    def _log_step(
        self,
        step: int,
        version: int,
        batch: StepBatch,
        trajectories: list[Trajectory],
        advantages: AdvantageBatch,
        datums: list[Any],
        metrics: dict[str, Any],
        marks: Marks,
        weights_at: float,
    ) -> None:
        rollouts = [r for group in batch.groups for r in group.rollouts]
        staleness = [g.staleness for g in batch.groups if g.staleness is not None]
        record = step_record(
            step=step,
            policy_version=version,
            trajectories=trajectories,
            statuses=[r.status for r in rollouts],
            report=merged_reports(group.report for group in batch.groups),
            batch=advantages,
            datums=len(datums),
            metrics=metrics,
            marks=marks,
            last_finished_at=max((r.updated_at for r in rollouts), default=None),
            weights_at=weights_at,
        ) | {
            "follow": True,
            "groups_stale_dropped": batch.stale_groups,
            "rollouts_stale_dropped": batch.stale_rollouts,
            "staleness_mean": round(statistics.fmean(staleness), 3) if staleness else None,
            "staleness_max": max(staleness) if staleness else None,
        }
        self.log.write(record)
        stale = f" · {batch.stale_groups} stale groups dropped" if batch.stale_groups else ""
        self.log.say(step_line(record) + stale)

    async def _evaluate(self, store: Store, step: int, since: float) -> None:
        """Log the held-out rollouts' mean return once none of them runs (module doc)."""
        pending = await store.list_rollouts(consumed=False, eval=True, created_since=since)
        if not pending or any(not r.status.is_final for r in pending):
            return
        t0 = time.perf_counter()
        returns: list[float] = []
        versions: list[int] = []
        for rollout in pending:
            value = await rollout_return(store, rollout.rollout_id, self.options)
            if value is not None and rollout.status is RolloutStatus.SUCCEEDED:
                returns.append(value)
            async for call in store.iter_llm_calls(rollout.rollout_id):
                if call.policy_version is not None:
                    versions.append(call.policy_version)
        await store.mark_consumed([r.rollout_id for r in pending], step)
        record = eval_record(returns, len(pending), step=step, seconds=time.perf_counter() - t0) | {
            "eval_policy_version_min": min(versions) if versions else None,
            "eval_policy_version_max": max(versions) if versions else None,
        }
        self.log.write(record)
        value = record["eval_reward"]
        self.log.say(
            f"[bold]eval[/bold] after step {step}: held-out reward {format_reward(value)} over {len(returns)} "
            f"rollouts the harness marked eval"
        )
        if self.summary.eval_start is None:
            self.summary.eval_start = value
        self.summary.eval_end = value


def _waiting_line(where: str, counts: WaitingCounts, have: int, want: int, group_size: int) -> str:
    """What a waiting trainer says: where it waits and what it has."""
    line = (
        f"waiting for rollouts at {where}: {have}/{want} groups of {group_size} for this step; "
        f"{counts.running} rollouts running, {counts.finished} finished in {counts.incomplete_groups} incomplete groups"
    )
    if counts.unnamed:
        line += (
            f"; {counts.unnamed} finished rollouts name no task (POST .../start or .../finish with task_id) "
            "and join no group"
        )
    return line
