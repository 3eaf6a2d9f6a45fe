"""Online GRPO: an unmodified agent, run through the proxy, trained on its own exact tokens.

The online mode of `GRPOTrainer` (grpo.py), the loop below, which reads top to bottom. Each step:

1. sample — `batch_size` tasks × `group_size` rollouts through the runner and the in-process proxy;
2. convert — the store's calls and rewards of those rollouts become trajectories;
   rewards the trainer adds — the judge's scores (one call per group, `judge.py`) and the shaping
   penalties (`shaping.py`) — are stored and folded into the returns;
3. advantages — each return against its group's (`advantages.py`; groups with equal returns teach
   nothing), or with a `teacher`, per token: teacher logprob − student logprob (`distill.py`);
4. datums — one per trajectory segment, the advantage on its sampled tokens;
5. train — forward_backward + optim_step (`step.train_step`, shared with offline and the warm start);
6. sync — the new adapter handed to the live sampler (no restart);
7. log — one metrics record; 8. eval — held-out tasks every `eval_every` steps (and the validation
   tasks; with `keep_best` the adapter of the best validation reward is kept, `best_adapter.py`);
9. checkpoint — every `checkpoint_every` steps (`loop_state.py`); `resume` continues from the last,
   and because step k always takes the same tasks (a seeded schedule), nothing repeats or is skipped.

Before the first step: an optional supervised warm start (`warm_start.py`) and an evaluation. With
`max_staleness` K > 0 the rollouts of the next K steps are sampled while the current step trains
(`SampleAhead`); their tokens then come from a policy up to K versions old, which the truncated
importance sampling against the sampler's logprobs corrects. After the last step, with `keep_best`,
the kept adapter is loaded back: it is the run's final adapter.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agl_bridge.convert import ConversionReport, Trajectory, convert_store
from agl_bridge.convert.policy import ConvertOptions
from agl_bridge.primitives.client import TrainingClient
from agl_bridge.proxy.server import ProxyServer
from agl_bridge.runner import (
    AgentCommand,
    RetryPolicy,
    RolloutOutcome,
    Runner,
    RunnerConfig,
    TaskSchedule,
)
from agl_bridge.runner.recovery import fail_interrupted
from agl_bridge.runner.runner import AgentFunction
from agl_bridge.store.base import Store
from agl_bridge.train.advantages import AdvantageBatch, group_advantages
from agl_bridge.train.best_adapter import BestAdapter
from agl_bridge.train.config import GRPOConfig
from agl_bridge.train.datums import batch_datums
from agl_bridge.train.distill import Teacher, distill_items
from agl_bridge.train.evaluation import VALIDATION, eval_record, rollout_return
from agl_bridge.train.judge import GroupJudge, judge_groups
from agl_bridge.train.loop_state import resume_latest, save_checkpoint
from agl_bridge.train.policy import open_policy
from agl_bridge.train.run_log import RunLog, RunSummary, format_reward, step_line
from agl_bridge.train.shaping import add_rewards, shaping_rewards
from agl_bridge.train.step import grpo_settings, train_step
from agl_bridge.train.step_record import step_record
from agl_bridge.train.warm_start import warm_start


@dataclass
class OnlineRun:
    """One online run: the agent and its tasks (`GRPOTrainer` loads and checks them), trained per the config."""

    config: GRPOConfig
    agent: AgentFunction | AgentCommand
    schedule: TaskSchedule
    eval_tasks: list[Any]
    validation_tasks: list[Any]
    warm_start_pairs: list[tuple[Any, str]]

    @property
    def run_dir(self) -> Path:
        """Where the run writes (the config's `run_dir`)."""
        return Path(self.config.run_dir)

    def run(self, log: RunLog, *, resume: bool) -> RunSummary:
        """Set up the sampler, the training client and the proxy; run the loop; tear them down."""
        started = time.monotonic()
        config = self.config
        policy = open_policy(config)
        client, tokenizer = policy.client, policy.tokenizer
        try:
            # Loaded (and its tokenizer checked) before the proxy or any rollout starts: a bad teacher fails at once.
            teacher = (
                Teacher(
                    config.teacher,
                    policy_tokenizer=tokenizer,
                    policy_name=config.model,
                    max_batch_tokens=config.max_batch_tokens,
                )
                if config.teacher
                else None
            )
        except BaseException:
            policy.close()
            raise
        state = resume_latest(client, self.run_dir, config.seed, log) if resume else None
        proxy = policy.proxy(config, self.run_dir)
        try:
            proxy.start()
            log.say(f"proxy at {proxy.openai_base_url()} · model {config.model} · run dir {self.run_dir}")
            summary = asyncio.run(self._loop(client, proxy, tokenizer, log, state, teacher))
            summary.wall_time_s = time.monotonic() - started
        finally:
            proxy.stop()
            policy.close()
        return summary

    async def _loop(
        self,
        client: TrainingClient,
        proxy: ProxyServer,
        tokenizer: Any,
        log: RunLog,
        state: dict[str, Any] | None,
        teacher: Teacher | None,
    ) -> RunSummary:
        """The online GRPO loop (see the module docs), from step 0 or from the checkpoint `state`."""
        config = self.config
        settings = grpo_settings(config)
        options = config.convert_options()
        # With a judge or a teacher the agent need not emit a reward: keep such attempts (not "drop" them).
        convert_options = (
            dataclasses.replace(options, missing_reward="zero")
            if (config.judge or teacher) and config.missing_reward == "drop"
            else options
        )
        judge = None
        if config.judge is not None:
            judge = GroupJudge(
                config.judge, base_url=proxy.openai_base_url(), api_key=proxy.api_key, tokenizer=tokenizer
            )
            await judge.check()  # before any rollout runs
        summary = RunSummary(self.run_dir, 0, 0.0, None, None)
        # The proxy's store: one writer per store file in this process (a second connection to the same
        # file would contend with the proxy's for SQLite's write lock, and lose on a loaded machine).
        store = proxy.running_store()
        runner = self._runner(proxy, store, config.group_size)
        evaluator = self._runner(proxy, store, config.eval_group_size)
        evaluate = functools.partial(evaluate_held_out, evaluator, self.eval_tasks, store, options, log)
        # The figure a run ends with is read more than any other: it may take more rollouts per task.
        final_evaluator = (
            self._runner(proxy, store, config.final_eval_group_size)
            if config.final_eval_group_size not in (None, config.eval_group_size)
            else evaluator
        )
        evaluate_last = functools.partial(evaluate_held_out, final_evaluator, self.eval_tasks, store, options, log)
        validate = functools.partial(
            evaluate_held_out, evaluator, self.validation_tasks, store, options, log, split=VALIDATION
        )
        best = BestAdapter(self.run_dir, resume=state is not None) if config.keep_best else None
        ahead = SampleAhead(
            lambda step: runner.run(self.schedule.for_step(step), group_prefix=f"s{step}"),
            steps=config.steps,
            max_staleness=config.max_staleness,
        )
        try:
            if state is None:
                if config.warm_start.steps > 0 and self.warm_start_pairs:
                    before = await evaluate(step=0, label="before the supervised warm start", stage="before_warm_start")
                    await warm_start(client, tokenizer, self.warm_start_pairs, config, log)
                    summary.eval_start = await evaluate(step=0, label="after the warm start = start of RL")
                    summary.warm_start = {"before": before, "after": summary.eval_start}
                else:
                    summary.eval_start = await evaluate(step=0, label="start of RL")
                await _validate(validate, best, client, log, step=0, held_out=summary.eval_start)
                first_step = 0
            else:
                interrupted = await fail_interrupted(
                    store, "interrupted: the training process stopped before this attempt finished"
                )
                if interrupted:
                    log.say(f"{interrupted} rollouts left running by the interrupted run marked failed")
                summary.eval_start = state.get("eval_start")
                first_step = int(state["next_step"])

            for step in range(first_step, config.steps):
                # sample
                t0 = time.perf_counter()
                outcomes = await ahead.take(step)
                t1 = time.perf_counter()
                # convert
                report = ConversionReport()
                rollout_ids = [o.rollout_id for o in outcomes]
                trajectories = [
                    t
                    async for t in convert_store(store, rollout_ids=rollout_ids, options=convert_options, report=report)
                ]
                if report.graph_warnings:
                    log.say(f"step {step + 1}: {report.by_class_line()}")
                trajectories, rewarding = await self._trainer_rewards(trajectories, store, options, judge)
                # advantages, datums
                if teacher is not None:
                    items, rewarding["reverse_kl"] = await asyncio.to_thread(distill_items, trajectories, teacher)
                    batch = AdvantageBatch(items=items, groups=len(trajectories), trajectories=len(trajectories))
                else:
                    batch = group_advantages(
                        trajectories, estimator=config.advantage, std_scaling=config.advantage_std_scaling
                    )
                datums = batch_datums(
                    batch, aggregation=config.aggregation, estimator=config.advantage, budget=config.default_max_tokens
                )
                t2 = time.perf_counter()
                # train
                metrics = await train_step(client, datums, settings.at_learning_rate(config.learning_rate_at(step)))
                t3 = time.perf_counter()
                # sync (nothing trained: the sampler keeps its policy)
                if datums:
                    version = (await client.save_weights_and_get_sampling_client_async()).policy_version
                else:
                    assert client.sampler is not None  # the online run gives the client its sampler
                    version = client.sampler.policy_version
                t4 = time.perf_counter()
                weights_at = time.time()
                # log
                record = step_record(
                    step=step + 1,
                    policy_version=version,
                    trajectories=trajectories,
                    statuses=[o.status for o in outcomes],
                    report=report,
                    batch=batch,
                    datums=len(datums),
                    metrics=metrics | rewarding,
                    marks=(t0, t1, t2, t3, t4),
                    last_finished_at=max((o.finished_at for o in outcomes), default=None),
                    weights_at=weights_at,
                )
                log.write(record)
                log.say(step_line(record))
                # eval
                last = step + 1 == config.steps
                if (step + 1) % config.eval_every == 0 or last:
                    summary.eval_end = await (evaluate_last if last else evaluate)(
                        step=step + 1, label=f"after step {step + 1}"
                    )
                    await _validate(validate, best, client, log, step=step + 1, held_out=summary.eval_end)
                # checkpoint
                if (step + 1) % config.checkpoint_every == 0 or last:
                    save_checkpoint(client, self.run_dir, step + 1, summary.eval_start, config.seed, log)
                summary.steps = step + 1
        finally:
            ahead.cancel()
            runner.close()
            evaluator.close()
            if final_evaluator is not evaluator:
                final_evaluator.close()
            if judge is not None:
                await judge.close()
        kept = best.restore(client) if best is not None else None
        summary.eval_last = summary.eval_end
        if kept is not None:
            summary.kept_step, summary.eval_end = kept.step, kept.held_out_reward
            log.say(
                f"the run ends with the adapter of step {kept.step}: best validation reward "
                f"{format_reward(kept.validation_reward)}, held-out reward {format_reward(kept.held_out_reward)}"
            )
        client.save_weights_for_sampler(self.run_dir / "final_adapter")
        return summary

    async def _trainer_rewards(
        self, trajectories: list[Trajectory], store: Store, options: ConvertOptions, judge: GroupJudge | None
    ) -> tuple[list[Trajectory], dict[str, Any]]:
        """Add the judge's scores and the shaping penalties to the step's trajectories (and the store).

        Returns the trajectories that stay (groups the judge could not score are dropped) and the
        record fields that say what happened.
        """
        config = self.config
        fields: dict[str, Any] = {}
        added: dict[int, tuple[Trajectory, dict[str, float]]] = {}
        if judge is not None:
            judged = await judge_groups(judge, trajectories)
            trajectories = judged.kept
            added = {id(t): (t, rewards) for t, rewards in judged.rewards}
            fields = {"judge_calls": judged.calls, "groups_dropped_by_judge": judged.groups_dropped}
        if config.overlong_penalty is not None or config.repetition_penalty is not None:
            for trajectory in trajectories:
                shaped = shaping_rewards(trajectory, config.overlong_penalty, config.repetition_penalty)
                added.setdefault(id(trajectory), (trajectory, {}))[1].update(shaped)
        if added:
            await add_rewards(added.values(), options, store)
        return trajectories, fields

    def _runner(self, proxy: ProxyServer, store: Store, group_size: int) -> Runner:
        config = self.config
        settings: dict[str, Any] = {
            "server_url": proxy.base_url,
            "api_key": proxy.api_key,
            "model": proxy.model_name,
            "store": store,
            "config": RunnerConfig(
                group_size=group_size,
                concurrency=config.concurrency,
                timeout_s=config.rollout_timeout_s,
                retry=RetryPolicy(max_attempts=config.max_attempts),
            ),
            # Attempts spread over this proxy and the extra ones (same store; their samplers follow our adapters).
            "extra_proxies": config.extra_proxies(),
        }
        if config.runner == "ray":  # each attempt a Ray task; the store stays written from here
            from agl_bridge.runner.ray_runner import RayRunner

            return RayRunner(self.agent, ray_address=config.ray_address, **settings)
        return Runner(self.agent, **settings)


class SampleAhead:
    """Sampling that runs ahead of training: `take(k)` returns step k's rollouts, having first started the
    sampling of every step up to k + `max_staleness`, so those rollouts are gathered while step k trains."""

    def __init__(
        self,
        sample: Callable[[int], Coroutine[Any, Any, list[RolloutOutcome]]],
        *,
        steps: int,
        max_staleness: int,
    ) -> None:
        self._sample = sample
        self._steps = steps
        self._max_staleness = max_staleness
        self._pending: deque[tuple[int, asyncio.Task[list[RolloutOutcome]]]] = deque()

    async def take(self, step: int) -> list[RolloutOutcome]:
        """Step `step`'s rollouts, once they are all done (steps are taken in order)."""
        upcoming = self._pending[-1][0] + 1 if self._pending else step
        while len(self._pending) <= self._max_staleness and upcoming < self._steps:
            self._pending.append((upcoming, asyncio.create_task(self._sample(upcoming))))
            upcoming += 1
        sampled_step, sampling = self._pending.popleft()
        assert sampled_step == step, f"step {step} taken while step {sampled_step} was next"
        return await sampling

    def cancel(self) -> None:
        """Stop the sampling of steps that will not be taken (the run ends or failed)."""
        for _, task in self._pending:
            task.cancel()


async def _validate(
    validate: Callable[..., Coroutine[Any, Any, float | None]],
    best: BestAdapter | None,
    client: TrainingClient,
    log: RunLog,
    *,
    step: int,
    held_out: float | None,
) -> None:
    """Evaluate the validation tasks (if any); with `keep_best`, offer the current adapter."""
    reward = await validate(step=step, label=f"after step {step}" if step else "start of RL")
    if best is not None and best.offer(client, step=step, validation_reward=reward, held_out_reward=held_out):
        log.say(f"kept the adapter of {f'step {step}' if step else 'the start of RL'}: best validation reward so far")


async def evaluate_held_out(
    evaluator: Runner,
    tasks: Sequence[Any],
    store: Store,
    options: ConvertOptions,
    log: RunLog,
    *,
    step: int,
    label: str,
    stage: str = "rl",
    split: str = "held-out",
) -> float | None:
    """The mean return over `tasks` — the held-out ones, or with `split=VALIDATION` the validation ones —
    logged as an "eval" (or "validation") record; None without tasks or rewards.

    A rollout's return weighs its rewards as training does (`weighted_return` with the run's
    options); rollouts that emitted no reward are counted apart (`eval_without_reward`).
    """
    if not tasks:
        return None
    t0 = time.perf_counter()
    outcomes = await evaluator.run(tasks, group_prefix=f"eval{step}-{int(time.time() * 1000) % 10**8}")
    scored = [await rollout_return(store, outcome.rollout_id, options) for outcome in outcomes]
    returns = [value for value in scored if value is not None]
    record = eval_record(returns, len(outcomes), step=step, seconds=time.perf_counter() - t0, stage=stage, split=split)
    log.write(record)
    value = record[f"{record['phase']}_reward"]
    log.say(f"[bold]eval[/bold] {label}: {split} reward {format_reward(value)} over {len(returns)} rollouts")
    return value
