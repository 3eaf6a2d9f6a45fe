"""Fixtures for the training primitives: clients over the tiny model and small synthetic batches."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agl_bridge.train import TrainingClient


@pytest.fixture
def make_client(tiny_model_dir: Path) -> Iterator[Callable[..., TrainingClient]]:
    """Factory for TrainingClients on the tiny model (closed after the test); kwargs go to the client."""
    clients: list[TrainingClient] = []

    def make(**kwargs) -> TrainingClient:
        kwargs.setdefault("lora_rank", 8)
        client = TrainingClient(str(kwargs.pop("base_model", tiny_model_dir)), device="cpu", **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
