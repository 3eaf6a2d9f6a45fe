"""The entry point of every training mode: `GRPOTrainer(config, agent=..., tasks=...).run()`.

It loads and checks a run's inputs before any model loads, then runs the one loop of the run's mode —
each a module of its own that reads top to bottom:

* online GRPO (`online.py`): an unmodified agent run through the proxy, trained on its own tokens;
* offline GRPO (`offline.py`, with `offline_data`): recorded trajectories, no agent;
* follow (`follow.py`, `mode = "follow"`): the rollouts an outside harness sends, as they finish;
* DPO (`dpo.py`, `mode = "dpo"`): preference pairs;

with the supervised warm start (`warm_start.py`) before RL where the config asks for it. Every mode
ends the same way: its step records (`step_record.py`), its final adapter, and the reward curve.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agl_bridge.errors import ConfigError
from agl_bridge.runner import (
    AgentCommand,
    TaskSchedule,
    load_agent,
    load_tasks,
)
from agl_bridge.runner.runner import AgentFunction
from agl_bridge.store.errors import StoreError
from agl_bridge.store.location import is_postgres_location
from agl_bridge.store.postgres_check import check_postgres_store
from agl_bridge.train.config import GRPOConfig, config_to_dict
from agl_bridge.train.dpo import train_dpo
from agl_bridge.train.follow import train_follow
from agl_bridge.train.offline import train_offline
from agl_bridge.train.online import OnlineRun
from agl_bridge.train.plot import plot_run
from agl_bridge.train.run_log import RunLog, RunSummary
from agl_bridge.train.warm_start import load_pairs


class GRPOTrainer:
    """Runs a GRPO training job described by a `GRPOConfig`: online through the agent, or offline on recorded data.

    agent / tasks / eval_tasks / validation_tasks / warm_start_pairs override the config's `agent`, `tasks`,
    `eval_tasks`, `validation_tasks` and `warm_start.data`; `log` replaces the run's own `RunLog` (left open).
    """

    def __init__(
        self,
        config: GRPOConfig,
        *,
        agent: AgentFunction | AgentCommand | None = None,
        tasks: Sequence[Any] | None = None,
        eval_tasks: Sequence[Any] | None = None,
        validation_tasks: Sequence[Any] | None = None,
        warm_start_pairs: Sequence[tuple[Any, str]] | None = None,
        log: RunLog | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self.run_dir = Path(config.run_dir)
        self._log = log
        if config.mode == "follow":
            self.warm_start_pairs = (
                list(warm_start_pairs) if warm_start_pairs is not None else load_pairs(config.warm_start.data)
            )
            return
        if config.mode == "dpo":
            return
        if config.offline_data:
            if is_postgres_location(config.offline_data):
                try:  # before the model loads: an unreachable or empty database is said in one line now
                    check_postgres_store(config.offline_data)
                except StoreError as exc:
                    raise ConfigError(f"offline_data: {exc}") from None
            elif not Path(config.offline_data).is_file():
                raise ConfigError(
                    f"offline_data {config.offline_data} does not exist; give a store (.sqlite, or a "
                    "postgresql:// URL) or trajectories (.jsonl/.parquet)"
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
        self.validation_tasks = (
            list(validation_tasks)
            if validation_tasks is not None
            else (load_tasks(config.validation_tasks) if config.validation_tasks else [])
        )
        if config.keep_best and not self.validation_tasks:
            raise ConfigError(
                "keep_best needs validation tasks (validation_tasks = 'validation.jsonl'): tasks never trained on and "
                "apart from eval_tasks, by whose reward the run's adapter is chosen"
            )
        self.warm_start_pairs = (
            list(warm_start_pairs) if warm_start_pairs is not None else load_pairs(config.warm_start.data)
        )
        self.schedule = TaskSchedule(self.tasks, config.batch_size, config.seed, shuffle=config.shuffle_tasks)

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
        try:
            if self.config.mode == "dpo":
                summary = train_dpo(self.config, log, resume=resume)
            elif self.config.offline_data:
                summary = train_offline(self.config, log, resume=resume)
            elif self.config.mode == "follow":
                summary = train_follow(self.config, log, resume=resume, warm_start_pairs=self.warm_start_pairs)
            else:
                summary = OnlineRun(
                    self.config,
                    self.agent,
                    self.schedule,
                    self.eval_tasks,
                    self.validation_tasks,
                    self.warm_start_pairs,
                ).run(log, resume=resume)
        finally:
            if self._log is None:
                log.close()
        try:
            plot_run(self.run_dir)
        except ValueError:
            pass
        return summary
