"""Offline GRPO: steps over recorded trajectories (a store or an export), without running any agent.

Groups (the rollouts of one task in one step, by group id) are taken `batch_size` per step in a
seeded order; the data's sampler logprobs come from older policies, which the truncated importance
sampling corrects. Each step: groups → advantages → datums → train; checkpoints as online.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from agl_bridge.convert import (
    ConversionReport,
    ConvertOptions,
    Trajectory,
    convert_store,
    group_trajectories,
    iter_trajectories,
)
from agl_bridge.errors import ConfigError
from agl_bridge.models.loading import resolve_model_path
from agl_bridge.runner import TaskSchedule
from agl_bridge.store.export import open_existing_store
from agl_bridge.store.location import describe_location, is_postgres_location
from agl_bridge.train.advantages import group_advantages
from agl_bridge.train.config import GRPOConfig
from agl_bridge.train.datums import batch_datums
from agl_bridge.train.loop_state import resume_latest, save_checkpoint
from agl_bridge.train.run_log import RunLog, RunSummary, step_line
from agl_bridge.train.shaping import add_rewards, shaping_rewards
from agl_bridge.train.step import grpo_settings, run_client, train_step
from agl_bridge.train.step_record import step_record


async def offline_groups(path: str, options: ConvertOptions, log: RunLog | None = None) -> list[list[Trajectory]]:
    """The GRPO groups of recorded trajectories: from a store (converted now, with the run's `options`)
    or an exported file (converted when it was exported).

    A store is a SQLite file (.sqlite, .db, .sqlite3) or a PostgreSQL URL; it must exist (StoreError
    saying why not). From a store, what could not be converted (and why) and the calls by class are
    said on the log's console (stderr).
    """
    if is_postgres_location(path) or Path(path).suffix in (".sqlite", ".db", ".sqlite3"):
        report = ConversionReport()
        async with open_existing_store(path) as store:
            trajectories = [t async for t in convert_store(store, options=options, report=report)]
        if log is not None:
            for line in (report.left_out(), report.by_class_line()):
                if line:
                    log.say(f"{describe_location(path)}: {report.attempts_converted} attempts converted; {line}")
    else:
        trajectories = list(iter_trajectories(path))
    return list(group_trajectories(trajectories).values())


def train_offline(config: GRPOConfig, log: RunLog, *, resume: bool = False) -> RunSummary:
    """GRPO on `config.offline_data` for `config.steps` steps; with `resume`, from the last checkpoint."""
    started = time.monotonic()
    run_dir = Path(config.run_dir)
    assert config.offline_data is not None  # GRPOTrainer comes here only with offline data
    options = config.convert_options()
    groups = asyncio.run(offline_groups(config.offline_data, options, log))
    if not groups:
        raise ConfigError(f"{config.offline_data} holds no trainable trajectories")
    if config.overlong_penalty is not None or config.repetition_penalty is not None:
        shaped = [
            (t, shaping_rewards(t, config.overlong_penalty, config.repetition_penalty))
            for group in groups
            for t in group
        ]
        asyncio.run(add_rewards(shaped, options))  # once, in memory: the data is not ours to write to
    schedule = TaskSchedule(groups, config.batch_size, config.seed)
    settings = grpo_settings(config)
    client = run_client(config, resolve_model_path(config.model))
    try:
        state = resume_latest(client, run_dir, config.seed, log, sync=False) if resume else None
        log.say(
            f"offline GRPO on {sum(map(len, groups))} trajectories in {len(groups)} groups from {config.offline_data}"
        )
        for step in range(0 if state is None else int(state["next_step"]), config.steps):
            t0 = time.perf_counter()
            members = [t for group in schedule.for_step(step) for t in group]
            batch = group_advantages(members, estimator=config.advantage, std_scaling=config.advantage_std_scaling)
            datums = batch_datums(
                batch, aggregation=config.aggregation, estimator=config.advantage, budget=config.default_max_tokens
            )
            t2 = time.perf_counter()
            metrics = asyncio.run(train_step(client, datums, settings.at_learning_rate(config.learning_rate_at(step))))
            t3 = time.perf_counter()
            # Nothing was sampled (the data is recorded) and no sampler serves these weights.
            record = step_record(
                step=step + 1,
                policy_version=None,
                trajectories=members,
                statuses=None,
                report=None,  # converted once, before the first step (said on the console)
                batch=batch,
                datums=len(datums),
                metrics=metrics,
                marks=(t0, t0, t2, t3, t3),
                last_finished_at=None,
                weights_at=time.time(),
            ) | {"offline": True}
            log.write(record)
            log.say(step_line(record))
            if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
                save_checkpoint(client, run_dir, step + 1, None, config.seed, log)
        client.save_weights_for_sampler(run_dir / "final_adapter")
    finally:
        client.close()
    return RunSummary(run_dir, config.steps, time.monotonic() - started, None, None)
