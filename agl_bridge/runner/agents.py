"""Loading an agent from its spec: a Python function by file or module path, or a command to run."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from pathlib import Path

from agl_bridge.errors import ConfigError
from agl_bridge.runner.command import AgentCommand
from agl_bridge.runner.runner import AgentFunction


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
