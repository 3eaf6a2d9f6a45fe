"""Loading an agent from its spec: a file or module function, or a command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agl_bridge.errors import ConfigError
from agl_bridge.runner import load_agent


def test_load_agent(tmp_path: Path) -> None:
    (tmp_path / "my_agent.py").write_text("def run(task, endpoint):\n    return 1.0\n")
    assert load_agent(f"{tmp_path / 'my_agent.py'}:run")(None, None) == 1.0
    assert load_agent("json:dumps") is json.dumps
    assert load_agent(["python", "agent.py"]).argv == ["python", "agent.py"]
    for spec, message in (
        ("nocolon", "must look like"),
        (f"{tmp_path / 'nope.py'}:run", "does not exist"),
        ("json:nothing", "no function"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_agent(spec)
