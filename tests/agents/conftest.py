"""Fixtures for the agent recipe tests: one `agl-bridge serve --model tiny` behind a recording tap.

The server is started once per session (loading torch, LiteLLM and the model takes a while) and
stopped by its PID at the end; every test gives its agent a rollout of its own, so the shared store
keeps them apart.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from agent_server import AgentServer, serve_tiny


@pytest.fixture(scope="session")
def agent_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    """`agl-bridge serve --model tiny --port 0` in a subprocess, with an `HttpTap` in front of it."""
    with serve_tiny(tmp_path_factory.mktemp("agent_recipes")) as server:
        yield server


@pytest.fixture(scope="session")
def tiny_scorer(agent_server: AgentServer) -> Any:
    """The served tiny model itself (the same cached build `--model tiny` loaded), for rescoring."""
    from agl_bridge.models.loading import ensure_tiny_model, load_causal_lm

    return load_causal_lm(ensure_tiny_model()).eval()


@pytest.fixture(scope="session")
def tiny_tokenizer(agent_server: AgentServer) -> Any:
    """The served tiny model's tokenizer, to compare what the agent sent back with what was sampled."""
    from transformers import AutoTokenizer

    from agl_bridge.models.loading import ensure_tiny_model

    return AutoTokenizer.from_pretrained(ensure_tiny_model())
