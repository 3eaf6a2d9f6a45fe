"""Helpers every test folder uses: unique ids, free ports, clients on a rollout, exact bits, store queries.

`tests/` is on the import path of every test (`pythonpath` in pyproject.toml), so any test imports
these as `from shared_helpers import ...`. Fixtures shared across folders are in tests/conftest.py;
the harness the benchmarks share with the tests (subprocess proxies, load, fuzzing) is
`agl_bridge.testing`.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import struct
import sys
import uuid
from collections.abc import AsyncIterable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import openai

from agl_bridge import semconv

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]
"""The repository root (the working directory of subprocesses that import `agl_bridge` from it)."""

AGL_BRIDGE = str(Path(sys.executable).with_name("agl-bridge"))
"""The `agl-bridge` command of the Python running the tests."""

ROLLOUT_ENV_VARS = (
    semconv.ENV_ROLLOUT_ID,
    semconv.ENV_ATTEMPT_ID,
    semconv.ENV_ENDPOINT,
    semconv.ENV_API_KEY,
    semconv.ENV_OPENAI_API_KEY,
    semconv.ENV_REWARD_TIMEOUT_S,
)
"""Variables that point `emit_reward` at a rollout: tests remove them so a developer's shell cannot leak in."""


def new_id(prefix: str) -> str:
    """A rollout/attempt id no other test uses (the session proxy and its store are shared)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def free_port() -> int:
    """A port nothing listens on right now (bound and released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def collect(items: AsyncIterable[T]) -> list[T]:
    """All items of an async iterator."""
    return [item async for item in items]


def float_bits(values: Iterable[float]) -> list[bytes]:
    """Exact IEEE-754 bit patterns, so -0.0 and 0.0 differ and nothing is compared loosely."""
    return [struct.pack("<d", value) for value in values]


def query(path: str | os.PathLike[str], sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows of a read-only query on a store file, from a fresh connection."""
    with sqlite3.connect(path) as conn:
        return conn.execute(sql, params).fetchall()


def openai_client(server: Any, rollout_id: str, attempt_id: str = "at-1") -> openai.OpenAI:
    """An OpenAI client on one rollout attempt of a `ProxyServer`: its key, no retries, 60 s timeout."""
    return openai.OpenAI(
        base_url=server.openai_base_url(rollout_id, attempt_id), api_key=server.api_key, max_retries=0, timeout=60
    )


def async_openai_client(server: Any, rollout_id: str, attempt_id: str = "at-1") -> openai.AsyncOpenAI:
    """`openai_client`, async."""
    return openai.AsyncOpenAI(
        base_url=server.openai_base_url(rollout_id, attempt_id), api_key=server.api_key, max_retries=0, timeout=60
    )


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map, in which byte-level BPE vocabularies spell single bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping: dict[int, str] = {}
    unprintable = 0
    for byte in range(256):
        if byte in printable:
            mapping[byte] = chr(byte)
        else:
            mapping[byte] = chr(256 + unprintable)
            unprintable += 1
    return mapping


def one_id_per_byte(tokenizer: Any, text: str) -> list[int]:
    """`text` spelled one byte per token: multi-byte characters are split across tokens."""
    alphabet = byte_level_alphabet()
    ids = [tokenizer.convert_tokens_to_ids(alphabet[byte]) for byte in text.encode("utf-8")]
    assert all(isinstance(i, int) and i != tokenizer.unk_token_id for i in ids), "a byte missing from the vocabulary"
    return ids


def replayable_stores(monkeypatch: Any) -> None:
    """Make stores built from now on in this test hold identical ids and times, whatever the backend.

    The ids a store makes (attempts, rollouts without one) come from a counter, and the clock reads
    one fixed instant, so the same writes into a SQLite file and a PostgreSQL database give records
    that print the same (for tests comparing what commands show of each). Call it again before
    building the next store: the ids start over.
    """
    import itertools
    import time

    from agl_bridge.store import batched

    counters: dict[str, itertools.count[int]] = {}
    monkeypatch.setattr(
        batched, "new_id", lambda prefix: f"{prefix}-{next(counters.setdefault(prefix, itertools.count())):06d}"
    )
    monkeypatch.setattr(time, "time", lambda: 1_767_225_600.25)
