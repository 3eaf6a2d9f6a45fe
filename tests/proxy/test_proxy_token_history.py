"""Turns of one rollout served by different proxies stay exact: the token cache is recovered from the store.

Two `ChatService`s (two proxies, each with its own in-memory token caches) on one store serve the
turns of each conversation alternately; turn k+1's prompt must extend turn k's prompt + sampled ids
token for token. Without the store history the same alternation breaks that (the control), which
shows the check can fail. Runs on both store backends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from shared_helpers import collect

from agl_bridge.chat import ChatCodec
from agl_bridge.models.loading import load_causal_lm, load_tokenizer
from agl_bridge.proxy.recording import CallRecorder
from agl_bridge.proxy.service import ChatService, RolloutRoute
from agl_bridge.proxy.token_history import StoreTokenHistory
from agl_bridge.sampler.hf import HFSampler
from agl_bridge.store import PostgresStore, SQLiteStore, Store


@pytest.fixture(scope="module")
def sampler_and_codec(tiny_model_dir: Path) -> Any:
    tokenizer = load_tokenizer(tiny_model_dir)
    with HFSampler(load_causal_lm(tiny_model_dir), tokenizer, seed=0) as sampler:
        yield sampler, ChatCodec(tokenizer)


@pytest.fixture(params=["sqlite", "postgresql"])
async def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "sqlite":
        opened: SQLiteStore | PostgresStore = SQLiteStore(tmp_path / "s.db")
    else:
        opened = PostgresStore(request.getfixturevalue("postgres_dsn"))
    async with opened:
        yield opened


async def _alternate(store: Store, sampler: Any, codec: ChatCodec, *, history: bool, tag: str) -> tuple[int, int]:
    """Serve 8 conversations × 4 turns alternately on two services; (exact extensions, turn pairs)."""
    services = [
        ChatService(
            sampler=sampler,
            codec=codec,
            recorder=CallRecorder(store),
            model_name="tiny",
            history=StoreTokenHistory(store) if history else None,
        )
        for _ in range(2)
    ]
    exact = pairs = 0
    for conversation in range(8):
        rollout_id = f"{tag}-{conversation}"
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"conversation {conversation}: go"}]
        for turn in range(4):
            service = services[(conversation + turn) % 2]
            body = {"messages": messages, "max_tokens": 12, "temperature": 1.0, "seed": 100 * conversation + turn}
            result = await service.complete(service.parse_request(body), RolloutRoute(rollout_id, "0"))
            messages = [
                *messages,
                {"role": "assistant", "content": result.choices[0].message.content},
                {"role": "user", "content": f"turn {turn + 1}"},
            ]
        calls = await collect(store.iter_llm_calls(rollout_id, "0"))
        assert len(calls) == 4
        for before, after in zip(calls, calls[1:], strict=False):
            expected = before.prompt_token_ids + before.response_token_ids
            pairs += 1
            exact += after.prompt_token_ids[: len(expected)] == expected
    return exact, pairs


async def test_turns_served_by_two_proxies_extend_each_other_exactly(any_store: Store, sampler_and_codec: Any) -> None:
    sampler, codec = sampler_and_codec
    exact, pairs = await _alternate(any_store, sampler, codec, history=True, tag="with")
    assert exact == pairs == 24


async def test_without_the_store_history_alternating_proxies_break_the_prefix(
    tmp_path: Path, sampler_and_codec: Any
) -> None:
    sampler, codec = sampler_and_codec
    async with SQLiteStore(tmp_path / "control.db") as store:
        exact, pairs = await _alternate(store, sampler, codec, history=False, tag="without")
    assert exact < pairs, "re-tokenized text happened to match every time: the exactness check proves nothing"
