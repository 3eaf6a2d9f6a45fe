"""Running an agent that lives in another process (any language) for one rollout attempt.

The command gets everything through its environment: `OPENAI_BASE_URL` (already routed to the
rollout attempt), `OPENAI_API_KEY` and `AGL_API_KEY` (both an agent key scoped to this attempt:
its model routes, nothing else — never the proxy's operator key), `AGL_ROLLOUT_ID`,
`AGL_ATTEMPT_ID`, `AGL_ENDPOINT`, `AGL_MODEL` and `AGL_TASK` (the task as JSON). It reports
rewards — from any language — by printing a line `agl-reward: VALUE` (or `agl-reward NAME: VALUE`)
on stdout, which the runner reads and stores; its own `emit_reward` is refused by the proxy (an
agent key cannot report rewards). Exit code 0 means success.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agl_bridge import semconv
from agl_bridge.runner.endpoint import Endpoint

_REWARD_LINE = re.compile(r"^agl-reward(?:\s+(?P<name>[A-Za-z0-9_.\-]+))?\s*:\s*(?P<value>\S+)\s*$")
_STDERR_TAIL = 4000


class AgentCommandError(RuntimeError):
    """The agent command exited with a non-zero status; the message has its stderr tail."""


@dataclass(frozen=True)
class AgentCommand:
    """An executable to run once per rollout attempt, e.g. `["python", "my_agent.py"]`."""

    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None

    def environment(self, task: object, endpoint: Endpoint) -> dict[str, str]:
        """The process environment for one attempt: ours on top of the current one and `env`."""
        return {
            **os.environ,
            **self.env,
            "OPENAI_BASE_URL": endpoint.base_url,
            "OPENAI_API_KEY": endpoint.api_key,
            semconv.ENV_ROLLOUT_ID: endpoint.rollout_id,
            semconv.ENV_ATTEMPT_ID: endpoint.attempt_id,
            semconv.ENV_ENDPOINT: endpoint.server_url,
            semconv.ENV_API_KEY: endpoint.api_key,
            semconv.ENV_TASK: json.dumps(task),
            "AGL_MODEL": endpoint.model,
        }

    async def run(self, task: object, endpoint: Endpoint) -> dict[str, float]:
        """Run to completion; return the rewards it printed. Cancelling kills its process group."""
        process = await asyncio.create_subprocess_exec(
            *self.argv,
            env=self.environment(task, endpoint),
            cwd=self.cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # so a timeout can kill the agent and everything it started
        )
        try:
            stdout, stderr = await process.communicate()
        except asyncio.CancelledError:
            _kill_group(process.pid)
            await process.wait()
            raise
        if process.returncode != 0:
            tail = stderr.decode(errors="replace")[-_STDERR_TAIL:]
            raise AgentCommandError(f"agent command {list(self.argv)} exited with status {process.returncode}:\n{tail}")
        return parse_reward_lines(stdout.decode(errors="replace"))


def parse_reward_lines(stdout: str) -> dict[str, float]:
    """Rewards printed as `agl-reward: VALUE` / `agl-reward NAME: VALUE` lines (last one per name wins)."""
    rewards: dict[str, float] = {}
    for line in stdout.splitlines():
        match = _REWARD_LINE.match(line.strip())
        if match:
            try:
                value = float(match["value"])
            except ValueError:
                raise AgentCommandError(f"reward line {line.strip()!r} does not hold a number") from None
            if not math.isfinite(value):
                raise AgentCommandError(f"reward line {line.strip()!r} holds {value}; a reward must be a finite number")
            rewards[match["name"] or "reward"] = value
    return rewards


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
