"""The GRPO loop: an unmodified agent, run through the proxy, trained on its own exact tokens.

Each step: `batch_size` tasks × `group_size` rollouts through the runner and the in-process proxy
→ trajectories from the store → advantages (return − group mean) → datums → forward_backward in
micro-batches → optim_step → the new adapter handed to the live sampler (no restart). Evaluations
on held-out tasks and checkpoints every N steps; `resume` continues from the last checkpoint, and
because step k always takes the same tasks (a seeded order), no task is repeated or skipped.

With `max_staleness` K > 0 the rollouts of the next K steps are sampled while the current step
trains; their tokens then come from a policy up to K versions old, which the truncated importance
sampling against the sampler's logprobs corrects.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import os
import random
import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agl_bridge.chat import ChatCodec
from agl_bridge.convert import ConversionReport, ConvertOptions, Trajectory, convert_store
from agl_bridge.models.loading import load_tokenizer, resolve_model_path
from agl_bridge.proxy.server import ProxyServer
from agl_bridge.runner import AgentCommand, RetryPolicy, RolloutOutcome, Runner, RunnerConfig, load_tasks
from agl_bridge.runner.recovery import fail_interrupted
from agl_bridge.runner.runner import AgentFunction
from agl_bridge.sampler.factory import build_sampler
from agl_bridge.store.sqlite import SQLiteStore
from agl_bridge.train.advantages import datums_for, group_advantages
from agl_bridge.train.client import AdamParams, TrainingClient
from agl_bridge.train.config import ConfigError, GRPOConfig, config_to_dict
from agl_bridge.train.datum import Datum
from agl_bridge.train.plot import plot_run
from agl_bridge.train.run_log import RunLog, drop_records_after

CHECKPOINTS = "checkpoints"
_TRAIN_KEYS = ("loss", "grad_norm", "lr", "ratio_mean", "logprob_diff_abs_mean", "logprob_diff_abs_max", "entropy_mean")
LOOP_STATE = "grpo_state.json"


@dataclass
class RunSummary:
    """The figures a run ends with."""

    run_dir: Path
    steps: int
    wall_time_s: float
    eval_start: float | None
    eval_end: float | None
    warm_start: dict[str, float | None] = field(default_factory=dict)


def load_agent(spec: str | Sequence[str]) -> AgentFunction | AgentCommand:
    """`path/to/file.py:function`, `package.module:function`, or a command (list of strings)."""
    if not isinstance(spec, str):
        return AgentCommand(list(spec))
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise ConfigError(f"agent {spec!r} must look like 'path/to/agent.py:function' or 'package.module:function'")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise ConfigError(f"agent file {path} does not exist")
        module_spec = importlib.util.spec_from_file_location(f"agl_agent_{path.stem}", path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    agent = getattr(module, name, None)
    if not callable(agent):
        raise ConfigError(f"agent {spec!r}: {target} has no function {name!r}")
    return agent


class TaskSchedule:
    """Step k's tasks: positions k·B … k·B+B−1 of an endless sequence of seeded shuffles."""

    def __init__(self, tasks: Sequence[Any], batch_size: int, seed: int) -> None:
        if not tasks:
            raise ConfigError("the task set is empty")
        self.tasks = list(tasks)
        self.batch_size = batch_size
        self.seed = seed
        self._orders: dict[int, list[int]] = {}

    def for_step(self, step: int) -> list[Any]:
        """The tasks of one step (the same for a given step in every run with the same seed)."""
        out = []
        for position in range(step * self.batch_size, (step + 1) * self.batch_size):
            epoch, index = divmod(position, len(self.tasks))
            if epoch not in self._orders:
                order = list(range(len(self.tasks)))
                random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
                self._orders[epoch] = order
            out.append(self.tasks[self._orders[epoch][index]])
        return out


class GRPOTrainer:
    """Runs a GRPO training job described by a `GRPOConfig`."""

    def __init__(
        self,
        config: GRPOConfig,
        *,
        agent: AgentFunction | AgentCommand | None = None,
        tasks: Sequence[Any] | None = None,
        eval_tasks: Sequence[Any] | None = None,
        warm_start_pairs: Sequence[tuple[Any, str]] | None = None,
        log: RunLog | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self.run_dir = Path(config.run_dir)
        self._log = log
        if config.offline_data:
            if not Path(config.offline_data).is_file():
                raise ConfigError(
                    f"offline_data {config.offline_data} does not exist; give a store (.sqlite) or trajectories "
                    "(.jsonl/.parquet)"
                )
            return
        if agent is None and not config.agent:
            raise ConfigError(
                "agent is required: 'path/to/agent.py:function', 'package.module:function', or a command list"
            )
        if tasks is None and not config.tasks:
            raise ConfigError("tasks is required: a .jsonl or .csv task file")
        self.agent = agent if agent is not None else load_agent(config.agent)
        self.tasks = list(tasks) if tasks is not None else load_tasks(config.tasks)
        self.eval_tasks = (
            list(eval_tasks) if eval_tasks is not None else (load_tasks(config.eval_tasks) if config.eval_tasks else [])
        )
        self.warm_start_pairs = list(warm_start_pairs) if warm_start_pairs is not None else self._load_pairs()
        self.schedule = TaskSchedule(self.tasks, config.batch_size, config.seed)

    # ------------------------------------------------------------------ entry point

    def run(self, *, resume: bool = False) -> RunSummary:
        """Train; with `resume`, continue from the last checkpoint in run_dir."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.json").write_text(json.dumps(config_to_dict(self.config), indent=2, default=str))
        log = self._log or RunLog(
            self.run_dir,
            tensorboard=self.config.tensorboard,
            wandb_project=self.config.wandb_project,
            config=config_to_dict(self.config),
        )
        started = time.monotonic()
        if self.config.offline_data:
            try:
                return self._run_offline(log, resume, started)
            finally:
                if self._log is None:
                    log.close()
        model_path = resolve_model_path(self.config.model)
        tokenizer = load_tokenizer(model_path)
        # hf: merged in place in this process; remote / vllm: adapters written to adapter_dir and loaded by name.
        sampler = build_sampler(self.config.sampler_spec(), model_path, tokenizer, served_name=self._model_name())
        client = TrainingClient(
            model_path,
            lora_rank=self.config.lora_rank,
            lora_alpha=self.config.lora_alpha,
            train_unembedding=self.config.train_unembedding,
            seed=self.config.seed,
            sampler=sampler,
        )
        state = self._resume_state(client, log) if resume else None
        proxy = ProxyServer(
            sampler=sampler,
            tokenizer=tokenizer,
            store_path=self.run_dir / "store.sqlite",
            model_name=self._model_name(),
            port=0,
            default_max_tokens=self.config.default_max_tokens,
            litellm_config_path=self.config.litellm_config,
        )
        try:
            proxy.start()
            log.say(f"proxy at {proxy.openai_base_url()} · model {self.config.model} · run dir {self.run_dir}")
            summary = asyncio.run(self._train(client, proxy, tokenizer, log, state, started))
        finally:
            proxy.stop()
            client.close()
            sampler.close()
            if self._log is None:
                log.close()
        try:
            plot_run(self.run_dir)
        except ValueError:
            pass
        return summary

    def _run_offline(self, log: RunLog, resume: bool, started: float) -> RunSummary:
        """GRPO steps over recorded trajectories (a store or an export) without running any agent.

        Groups (rollouts of one task in one step, by group id) are taken `batch_size` per step in a
        seeded order; the data's sampler logprobs come from older policies, which the truncated
        importance sampling corrects.
        """
        assert self.config.offline_data is not None  # run() comes here only with offline data
        groups = asyncio.run(offline_groups(self.config.offline_data))
        if not groups:
            raise ConfigError(f"{self.config.offline_data} holds no trainable trajectories")
        schedule = TaskSchedule(groups, self.config.batch_size, self.config.seed)
        client = TrainingClient(
            resolve_model_path(self.config.model),
            lora_rank=self.config.lora_rank,
            lora_alpha=self.config.lora_alpha,
            train_unembedding=self.config.train_unembedding,
            seed=self.config.seed,
        )
        try:
            state = self._resume_state(client, log, sync=False) if resume else None
            log.say(
                f"offline GRPO on {sum(map(len, groups))} trajectories in {len(groups)} groups from "
                f"{self.config.offline_data}"
            )
            start = 0 if state is None else int(state["next_step"])
            for step in range(start, self.config.steps):
                began = time.perf_counter()
                members = [t for group in schedule.for_step(step) for t in group]
                batch = group_advantages(members, std_scaling=self.config.advantage_std_scaling)
                datums = datums_for(batch.items, self.config.aggregation) if batch.items else []
                metrics = asyncio.run(self._train_on(client, datums, step))
                record = {
                    "phase": "train",
                    "step": step + 1,
                    "offline": True,
                    **_reward_stats(members),
                    "trajectories": len(members),
                    "groups": batch.groups,
                    "groups_zero_variance": batch.groups_dropped_zero_variance,
                    "datums": len(datums),
                    **metrics,
                    "time_step_s": round(time.perf_counter() - began, 4),
                }
                log.write(record)
                log.say(
                    f"offline step {step + 1}: reward {_fmt(record.get('reward_mean'))} · loss {record.get('loss')}"
                )
                if (step + 1) % self.config.checkpoint_every == 0 or step + 1 == self.config.steps:
                    self._checkpoint(client, step + 1, None, log)
            client.save_weights_for_sampler(self.run_dir / "final_adapter")
        finally:
            client.close()
        return RunSummary(self.run_dir, self.config.steps, time.monotonic() - started, None, None)

    # ------------------------------------------------------------------ the loop

    async def _train(
        self,
        client: TrainingClient,
        proxy: ProxyServer,
        tokenizer: Any,
        log: RunLog,
        state: dict[str, Any] | None,
        started: float,
    ) -> RunSummary:
        config = self.config
        summary = RunSummary(self.run_dir, 0, 0.0, None, None)
        async with SQLiteStore(self.run_dir / "store.sqlite") as store:
            runner = self._runner(proxy, store, config.group_size)
            evaluator = self._runner(proxy, store, config.eval_group_size)
            try:
                start_step = 0 if state is None else int(state["next_step"])
                if state is not None:
                    interrupted = await fail_interrupted(
                        store, "interrupted: the training process stopped before this attempt finished"
                    )
                    if interrupted:
                        log.say(f"{interrupted} rollouts left running by the interrupted run marked failed")
                if state is None and config.warm_start.steps > 0 and self.warm_start_pairs:
                    summary.warm_start = await self._warm_start(client, tokenizer, evaluator, store, log)
                    summary.eval_start = summary.warm_start.get("after")
                elif self.eval_tasks and state is None:
                    summary.eval_start = await self._evaluate(evaluator, store, log, step=0, label="start of RL")
                else:
                    summary.eval_start = None if state is None else state.get("eval_start")
                pending: deque[tuple[int, asyncio.Task[list[RolloutOutcome]]]] = deque()
                for step in range(start_step, config.steps):
                    while len(pending) <= config.max_staleness and pending_next(pending, step) < config.steps:
                        upcoming = pending_next(pending, step)
                        pending.append((upcoming, asyncio.create_task(self._sample(runner, upcoming))))
                    sampled_step, sampling = pending.popleft()
                    assert sampled_step == step
                    record = await self._step(step, sampling, client, store, log)
                    log.write(record)
                    log.say(_step_line(record))
                    last = step == config.steps - 1
                    if self.eval_tasks and ((step + 1) % config.eval_every == 0 or last):
                        summary.eval_end = await self._evaluate(
                            evaluator, store, log, step=step + 1, label=f"after step {step + 1}"
                        )
                    if (step + 1) % config.checkpoint_every == 0 or last:
                        self._checkpoint(client, step + 1, summary.eval_start, log)
                    summary.steps = step + 1
                for _, task in pending:
                    task.cancel()
            finally:
                runner.close()
                evaluator.close()
        client.save_weights_for_sampler(self.run_dir / "final_adapter")
        summary.wall_time_s = time.monotonic() - started
        return summary

    async def _sample(self, runner: Runner, step: int) -> list[RolloutOutcome]:
        return await runner.run(self.schedule.for_step(step), group_prefix=f"s{step}")

    async def _step(
        self,
        step: int,
        sampling: asyncio.Task[list[RolloutOutcome]],
        client: TrainingClient,
        store: SQLiteStore,
        log: RunLog,
    ) -> dict[str, Any]:
        config = self.config
        t0 = time.perf_counter()
        outcomes = await sampling
        t1 = time.perf_counter()
        report = ConversionReport()
        trajectories = [
            t
            async for t in convert_store(
                store, rollout_ids=[o.rollout_id for o in outcomes], options=self._convert_options(), report=report
            )
        ]
        batch = group_advantages(trajectories, std_scaling=config.advantage_std_scaling)
        datums = datums_for(batch.items, config.aggregation) if batch.items else []
        t2 = time.perf_counter()
        train_metrics = await self._train_on(client, datums, step)
        t3 = time.perf_counter()
        if datums:
            version = (await client.save_weights_and_get_sampling_client_async()).policy_version
        else:
            assert client.sampler is not None  # the online run gives the client its sampler
            version = client.sampler.policy_version
        t4 = time.perf_counter()
        record: dict[str, Any] = {
            "phase": "train",
            "step": step + 1,
            "policy_version": version,
            **_reward_stats(trajectories),
            "rollouts": len(outcomes),
            "rollouts_failed": sum(o.status.value == "failed" for o in outcomes),
            "rollouts_timed_out": sum(o.status.value == "timed_out" for o in outcomes),
            "trajectories": len(trajectories),
            "dropped": report.attempts_dropped,
            "dropped_by_reason": dict(report.dropped),
            "segments": report.segments,
            "groups": batch.groups,
            "groups_zero_variance": batch.groups_dropped_zero_variance,
            "datums": len(datums),
            **train_metrics,
            "time_sample_s": round(t1 - t0, 4),
            "time_convert_s": round(t2 - t1, 4),
            "time_train_s": round(t3 - t2, 4),
            "time_sync_s": round(t4 - t3, 4),
        }
        record["time_step_s"] = round(t4 - t0, 4)
        outside = (t4 - t0) - (t1 - t0) - train_metrics["time_forward_backward_s"]
        record["overhead_share"] = round(outside / max(t4 - t0, 1e-9), 4)
        return record

    async def _train_on(self, client: TrainingClient, datums: list[Datum], step: int) -> dict[str, Any]:
        """forward_backward over micro-batches, then one optim_step at step's scheduled learning rate."""
        if not datums:  # every group had equal returns: nothing to learn, the record keeps its keys
            return {key: None for key in _TRAIN_KEYS} | {"trained_tokens": 0, "time_forward_backward_s": 0.0}
        config = self.config
        loss_config: dict[str, Any] = {"kl_coef": config.kl_coef}
        if config.loss_fn == "importance_sampling" and config.tis_cap is not None:
            loss_config["tis_cap"] = config.tis_cap
        if config.loss_fn in ("ppo", "cispo"):
            loss_config |= {
                "clip_low_threshold": config.clip_low_threshold,
                "clip_high_threshold": config.clip_high_threshold,
            }
        merged: dict[str, list[float]] = {}
        compute = 0.0
        for start in range(0, len(datums), config.micro_batch_size):
            began = time.perf_counter()
            output = await client.forward_backward_async(
                datums[start : start + config.micro_batch_size], config.loss_fn, loss_config
            )
            compute += time.perf_counter() - began
            for key, value in output.metrics.items():
                merged.setdefault(key, []).append(float(value))
        began = time.perf_counter()
        optim = await client.optim_step_async(
            AdamParams(
                learning_rate=config.learning_rate_at(step),
                beta1=config.beta1,
                beta2=config.beta2,
                weight_decay=config.weight_decay,
                grad_clip_norm=config.grad_clip_norm,
            )
        )
        compute += time.perf_counter() - began
        metrics = {key: _combine(key, values) for key, values in merged.items() if key != "time_s"}
        metrics.update({("optimizer_step" if key == "step" else key): value for key, value in optim.metrics.items()})
        metrics["trained_tokens"] = sum(1 for d in datums for w in d.loss_fn_inputs["weights"] if w)
        metrics["time_forward_backward_s"] = round(compute, 4)
        return metrics

    async def _evaluate(
        self, evaluator: Runner, store: SQLiteStore, log: RunLog, *, step: int, label: str, stage: str = "rl"
    ) -> float | None:
        t0 = time.perf_counter()
        outcomes = await evaluator.run(self.eval_tasks, group_prefix=f"eval{step}-{int(time.time() * 1000) % 10**8}")
        returns = []
        for outcome in outcomes:
            rewards: dict[str, float] = {}
            async for reward in store.iter_rewards(outcome.rollout_id):
                rewards[reward.name] = rewards.get(reward.name, 0.0) + reward.value
            if rewards:
                returns.append(
                    sum(self.config.reward_weights.get(name, 1.0) * value for name, value in rewards.items())
                )
        value = statistics.fmean(returns) if returns else None
        log.write(
            {
                "phase": "eval",
                "stage": stage,
                "step": step,
                "eval_reward": value,
                "eval_rollouts": len(outcomes),
                "eval_without_reward": len(outcomes) - len(returns),
                "time_eval_s": round(time.perf_counter() - t0, 3),
            }
        )
        log.say(f"[bold]eval[/bold] {label}: held-out reward {_fmt(value)} over {len(returns)} rollouts")
        return value

    async def _warm_start(
        self, client: TrainingClient, tokenizer: Any, evaluator: Runner, store: SQLiteStore, log: RunLog
    ) -> dict[str, float | None]:
        warm = self.config.warm_start
        before = (
            await self._evaluate(
                evaluator, store, log, step=0, label="before the supervised warm start", stage="before_warm_start"
            )
            if self.eval_tasks
            else None
        )
        codec = ChatCodec(tokenizer)
        rng = random.Random(self.config.seed)
        log.say(f"supervised warm start: {warm.steps} steps × {warm.batch_size} examples (cross_entropy), then RL")
        for index in range(warm.steps):
            pairs = [rng.choice(self.warm_start_pairs) for _ in range(warm.batch_size)]
            datums = [sft_datum(codec, prompt, response) for prompt, response in pairs]
            tokens = sum(sum(d.loss_fn_inputs["weights"]) for d in datums)
            for datum in datums:
                datum.loss_fn_inputs["weights"] = [w / tokens for w in datum.loss_fn_inputs["weights"]]
            output = await client.forward_backward_async(datums, "cross_entropy")
            await client.optim_step_async(
                AdamParams(learning_rate=warm.learning_rate, grad_clip_norm=self.config.grad_clip_norm)
            )
            if (index + 1) % max(1, warm.steps // 5) == 0 or index + 1 == warm.steps:
                log.write({"phase": "warm_start", "step": index + 1, "loss": output.metrics.get("loss")})
                log.say(f"warm start {index + 1}/{warm.steps}: loss {output.metrics.get('loss', float('nan')):.3f}")
        await client.save_weights_and_get_sampling_client_async()
        after = (
            await self._evaluate(evaluator, store, log, step=0, label="after the warm start = start of RL")
            if self.eval_tasks
            else None
        )
        return {"before": before, "after": after}

    # ------------------------------------------------------------------ pieces

    def _runner(self, proxy: ProxyServer, store: SQLiteStore, group_size: int) -> Runner:
        config = self.config
        return Runner(
            self.agent,
            server_url=proxy.base_url,
            api_key=proxy.api_key,
            model=self._model_name(),
            store=store,
            config=RunnerConfig(
                group_size=group_size,
                concurrency=config.concurrency,
                timeout_s=config.rollout_timeout_s,
                retry=RetryPolicy(max_attempts=config.max_attempts),
            ),
        )

    def _convert_options(self) -> ConvertOptions:
        return ConvertOptions(
            missing_reward=self.config.missing_reward, reward_weights=dict(self.config.reward_weights)
        )

    def _model_name(self) -> str:
        model = self.config.model
        return "tiny" if model.startswith("tiny") else Path(model.rstrip("/")).name

    def _checkpoint(self, client: TrainingClient, next_step: int, eval_start: float | None, log: RunLog) -> None:
        path = self.run_dir / CHECKPOINTS / f"step_{next_step:06d}"
        client.save_state(path)
        # Written to a temporary name and renamed: a kill mid-write must not leave a torn state file
        # that --resume would pick as the latest checkpoint.
        partial = path / f"{LOOP_STATE}.partial"
        partial.write_text(json.dumps({"next_step": next_step, "eval_start": eval_start, "seed": self.config.seed}))
        os.replace(partial, path / LOOP_STATE)
        log.say(f"checkpoint {path}")

    def _resume_state(self, client: TrainingClient, log: RunLog, *, sync: bool = True) -> dict[str, Any] | None:
        candidates = sorted((self.run_dir / CHECKPOINTS).glob(f"step_*/{LOOP_STATE}"))
        if not candidates:
            log.say(f"no checkpoint in {self.run_dir / CHECKPOINTS}; starting from scratch")
            return None
        state_file = candidates[-1]
        state = json.loads(state_file.read_text())
        if state.get("seed") != self.config.seed:
            raise ConfigError(
                f"{state_file.parent} was written with seed {state.get('seed')}, the config has {self.config.seed}; "
                "resuming with another seed would change which tasks each step takes"
            )
        client.load_state(state_file.parent)
        if sync:
            client.save_weights_and_get_sampling_client()
        dropped = drop_records_after(self.run_dir, int(state["next_step"]))
        log.say(
            f"resumed from {state_file.parent}: next step {state['next_step'] + 1}"
            + (f" ({dropped} metrics records after it dropped)" if dropped else "")
        )
        return state

    def _load_pairs(self) -> list[tuple[Any, str]]:
        data = self.config.warm_start.data
        if not data:
            return []
        pairs = []
        for index, record in enumerate(load_tasks(data), start=1):
            if not isinstance(record, dict) or "prompt" not in record or "response" not in record:
                raise ConfigError(f'{data}, record {index}: expected {{"prompt": ..., "response": ...}}')
            pairs.append((record["prompt"], str(record["response"])))
        return pairs


async def offline_groups(path: str) -> list[list[Trajectory]]:
    """The GRPO groups of recorded trajectories: from a store (converted now) or an exported file."""
    from agl_bridge.convert import group_trajectories, iter_trajectories

    if Path(path).suffix in (".sqlite", ".db", ".sqlite3"):
        async with SQLiteStore(path) as store:
            trajectories = [t async for t in convert_store(store)]
    else:
        trajectories = list(iter_trajectories(path))
    return list(group_trajectories(trajectories).values())


def sft_datum(codec: ChatCodec, prompt: Any, response: str) -> Datum:
    """A cross_entropy datum: the chat-templated prompt (mask 0) then the response + end-of-turn (mask 1)."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    prompt_ids = codec.encode_prompt(messages).token_ids
    response_ids = codec.tokenizer(response, add_special_tokens=False)["input_ids"] + [codec.stop_token_ids[0]]
    tokens = prompt_ids + response_ids
    return Datum.from_sequence(tokens, [0] * len(prompt_ids) + [1] * len(response_ids))


def pending_next(pending: deque[tuple[int, Any]], step: int) -> int:
    """The next step whose sampling has not started."""
    return pending[-1][0] + 1 if pending else step


def _reward_stats(trajectories: list[Trajectory]) -> dict[str, Any]:
    if not trajectories:
        return {"reward_mean": None, "reward_std": None}
    returns = [t.reward for t in trajectories]
    stats: dict[str, Any] = {"reward_mean": statistics.fmean(returns), "reward_std": statistics.pstdev(returns)}
    names = sorted({name for t in trajectories for name in t.rewards})
    for name in names:
        stats[f"reward_{name}_mean"] = statistics.fmean(t.rewards.get(name, 0.0) for t in trajectories)
    return stats


def _combine(key: str, values: list[float]) -> float:
    if key.endswith("_max"):
        return max(values)
    if key in ("loss", "tokens", "time_s"):
        return sum(values)
    return statistics.fmean(values)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.3f}"


def _step_line(record: dict[str, Any]) -> str:
    loss, gap = record.get("loss"), record.get("logprob_diff_abs_mean")
    trained = (
        "nothing to train (equal returns in every group)" if loss is None else f"loss {loss:.4f} · |Δlogprob| {gap:.2e}"
    )
    return (
        f"step {record['step']}: reward {_fmt(record.get('reward_mean'))} · {trained} · v{record['policy_version']} · "
        f"{record['time_step_s']:.1f}s (sample {record['time_sample_s']:.1f}s, train {record['time_train_s']:.1f}s)"
    )
