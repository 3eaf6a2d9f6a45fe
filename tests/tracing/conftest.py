"""Fixtures for the tracing tests: a clean rollout environment and live OTLP receivers (`store`: tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from fastapi.params import Depends
from shared_helpers import ROLLOUT_ENV_VARS
from tracing_helpers import CapturingSink, ReceiverServer

from agl_bridge.tracing import set_reward_sink

ENV_VARS = (
    *ROLLOUT_ENV_VARS,
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
)


@pytest.fixture(autouse=True)
def clean_rollout_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No AGL_* / key variables leak in from the developer's shell, and no reward sink stays set."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    previous = set_reward_sink(None)
    yield
    set_reward_sink(previous)


@pytest.fixture
def capturing_sink() -> CapturingSink:
    """A CapturingSink registered as this process's reward sink."""
    sink = CapturingSink()
    set_reward_sink(sink)
    return sink


@pytest.fixture
def make_receiver(tmp_path: Path) -> Iterator[Callable[..., ReceiverServer]]:
    """Start receivers (optionally with FastAPI dependencies); all are stopped after the test."""
    started: list[ReceiverServer] = []

    def factory(dependencies: Sequence[Depends] | None = None) -> ReceiverServer:
        server = ReceiverServer(tmp_path / f"receiver-{len(started)}.db", dependencies)
        server.start()
        started.append(server)
        return server

    yield factory
    for server in started:
        server.stop()


@pytest.fixture
def receiver(make_receiver: Callable[..., ReceiverServer]) -> ReceiverServer:
    """One running receiver without authentication."""
    return make_receiver()
