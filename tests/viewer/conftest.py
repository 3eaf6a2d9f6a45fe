"""Fixtures for the viewer tests: the scenario store, a run directory, and a client that brings the key."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from viewer_helpers import KEY, build_store, write_run_dir

from agl_bridge.viewer.app import Viewer, create_app


@pytest.fixture(scope="module")
def scenario_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scenario of `build_store` (shared by a module's tests: the viewer never writes)."""
    path = tmp_path_factory.mktemp("viewer_store") / "store.sqlite"
    asyncio.run(build_store(path))
    return path


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory with config.json and metrics.jsonl."""
    return write_run_dir(tmp_path_factory.mktemp("viewer_run") / "run")


@pytest.fixture(scope="module")
def viewer(scenario_store: Path, run_dir: Path) -> Iterator[Viewer]:
    """The viewer over the scenario store and run directory (token text off: no model)."""
    opened = Viewer(scenario_store, run_dir)
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def client(viewer: Viewer) -> TestClient:
    """A test client of the viewer app that sends the key."""
    test_client = TestClient(create_app(viewer, key=KEY, port=0))
    test_client.headers["authorization"] = f"Bearer {KEY}"
    return test_client
