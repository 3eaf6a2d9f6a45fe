"""Fixtures for the store tests: an open SQLiteStore in a temporary directory and a call factory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from agl_bridge.store import SQLiteStore
from agl_bridge.types import LLMCall


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    """Where the test's store file lives."""
    return tmp_path / "store.db"


@pytest.fixture
async def store(store_path: Path) -> AsyncIterator[SQLiteStore]:
    """An open store, closed after the test."""
    async with SQLiteStore(store_path) as opened:
        yield opened


@pytest.fixture
def make_call() -> Callable[..., LLMCall]:
    """Factory of token calls with short, distinct lists; keyword arguments override fields."""

    def factory(**overrides: Any) -> LLMCall:
        fields: dict[str, Any] = {
            "rollout_id": "ro-1",
            "attempt_id": "at-1",
            "model": "tiny",
            "prompt_token_ids": [1, 2, 3],
            "response_token_ids": [4, 5],
            "response_logprobs": [-0.25, -1.5],
            "messages": [{"role": "user", "content": "hi"}],
            "response_text": "hello",
            "finish_reason": "stop",
        }
        fields.update(overrides)
        return LLMCall(**fields)

    return factory
