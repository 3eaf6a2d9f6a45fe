"""Running an agent over a task set: tasks × group_size rollouts, concurrency, timeouts, retries;
loading the agent from its spec, and the seeded schedule of which tasks each training step runs."""

from __future__ import annotations

from agl_bridge.runner.agents import load_agent
from agl_bridge.runner.command import AgentCommand, AgentCommandError, parse_reward_lines
from agl_bridge.runner.endpoint import Endpoint
from agl_bridge.runner.proxies import ProxyAddress
from agl_bridge.runner.runner import (
    AgentResultError,
    RetryPolicy,
    RolloutOutcome,
    Runner,
    RunnerConfig,
    rewards_of,
    run_rollouts,
)
from agl_bridge.runner.schedule import TaskSchedule
from agl_bridge.runner.tasks import TaskFileError, load_tasks

__all__ = [
    "AgentCommand",
    "AgentCommandError",
    "AgentResultError",
    "Endpoint",
    "ProxyAddress",
    "RetryPolicy",
    "RolloutOutcome",
    "Runner",
    "RunnerConfig",
    "TaskFileError",
    "TaskSchedule",
    "load_agent",
    "load_tasks",
    "parse_reward_lines",
    "rewards_of",
    "run_rollouts",
]
