"""Export a store's LLM calls and rewards as JSON Lines, streamed in bounded memory (`--what calls`).

One JSON object per line. Every line has a `kind`:
  - `"llm_call"`: every field of an `LLMCall` (its own kind is `call_kind`, "token" or "text"),
    `usage` as `{"input_tokens", "output_tokens"}` or null, `declared_class` (one of main, retry,
    side, compaction, subagent) and `declared_parent` (a sequence as text, or the raw value sent)
    as the agent declared them, null when it declared nothing; `carries` (the earlier calls whose
    answer the request carried back, by sequence);
  - `"reward"`: every field of a `Reward`.
Records made outside any rollout have null `rollout_id`/`attempt_id`.

Order: records outside any rollout first, then by rollout id, attempt id (a rollout's records
made outside any attempt come before its attempts), then `sequence` — calls and rewards
interleaved, so a reward sits right after the call it followed (they share one sequence space per
(rollout, attempt)); choices of one call come in `choice_index` order. Rollout and attempt ids
made by the store start with their creation time, so this is creation order for them.

Exactness: floats are written with Python's shortest round-trip repr, so `json.loads` gives back
the very same float64 (bit for bit, -0.0 included). A logprob of -inf (which the store keeps) is
written as `-Infinity`, the JSON extension Python's `json` reads and writes; strict JSON parsers
reject it. Strings are ASCII-escaped, so the file is valid UTF-8 whatever the text holds.

The file is written atomically (`agl_bridge.export_files.atomic_output`). The trajectories export
is the converter's (`agl_bridge.convert.export`); `agl_bridge.export` maps `--what` to either.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agl_bridge.export_files import ExportCounts, atomic_output, closing_stream
from agl_bridge.store.base import Store
from agl_bridge.store.errors import NoStoreError, RolloutNotFoundError
from agl_bridge.store.location import StoreLocation, is_postgres_location, store_at
from agl_bridge.store.postgres import PostgresStore
from agl_bridge.store.sqlite import SQLiteStore
from agl_bridge.types import LLMCall, Reward, Usage

LLM_CALL_KIND = "llm_call"
"""`kind` of an exported LLM call record."""

REWARD_KIND = "reward"
"""`kind` of an exported reward record."""


def check_store_file(path: str | os.PathLike[str]) -> Path:
    """Return `path` if it is an existing, non-empty file, else raise NoStoreError.

    Opening a `SQLiteStore` on a missing or empty file would create a fresh empty store there;
    read-only commands check first so a mistyped path is reported instead.
    """
    where = Path(path)
    if where.is_dir():
        raise NoStoreError(f"{where} is a directory, not a store file; pass the store's .db file")
    if not where.exists():
        raise NoStoreError(
            f"no store at {where}; check the path (the store file is the one your proxy or runner records into)"
        )
    if where.stat().st_size == 0:
        raise NoStoreError(f"{where} is an empty file, not an agl_bridge store; check the path")
    return where


def open_existing_store(location: StoreLocation) -> SQLiteStore | PostgresStore:
    """An unopened store on an existing store: a SQLite file, or a PostgreSQL database that holds one.

    Raises NoStoreError if there is none there (nothing is created), and for a PostgreSQL URL
    StoreUnavailableError / StoreSchemaError naming host, port and the fix
    (`postgres_check.check_postgres_store`). Use as `async with open_existing_store(location) as store:`;
    opening raises StoreSchemaError for a file that is not a store of this schema version.
    """
    if is_postgres_location(location):
        from agl_bridge.store.postgres_check import check_postgres_store

        check_postgres_store(location)
        return store_at(location)
    return SQLiteStore(check_store_file(location))


def call_record(call: LLMCall) -> dict[str, Any]:
    """The export record (a JSON-able dict) of one LLM call."""
    usage = call.usage
    return {
        "kind": LLM_CALL_KIND,
        "rollout_id": call.rollout_id,
        "attempt_id": call.attempt_id,
        "sequence": call.sequence,
        "choice_index": call.choice_index,
        "model": call.model,
        "call_kind": call.kind,
        "prompt_token_ids": call.prompt_token_ids,
        "response_token_ids": call.response_token_ids,
        "response_logprobs": call.response_logprobs,
        "token_policy_versions": call.token_policy_versions,
        "policy_version": call.policy_version,
        "messages": call.messages,
        "response_text": call.response_text,
        "finish_reason": call.finish_reason,
        "agent_name": call.agent_name,
        "prefix_breaks": call.prefix_breaks,
        "started_at": call.started_at,
        "ended_at": call.ended_at,
        "usage": None if usage is None else {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens},
        "span_id": call.span_id,
        "trace_id": call.trace_id,
        "declared_class": None if call.declared_class is None else call.declared_class.value,
        "declared_parent": call.declared_parent,
        "carries": call.carries,
    }


def reward_record(reward: Reward) -> dict[str, Any]:
    """The export record (a JSON-able dict) of one reward."""
    return {
        "kind": REWARD_KIND,
        "rollout_id": reward.rollout_id,
        "attempt_id": reward.attempt_id,
        "sequence": reward.sequence,
        "name": reward.name,
        "value": reward.value,
        "timestamp": reward.timestamp,
        "span_id": reward.span_id,
        "trace_id": reward.trace_id,
    }


def record_from_json(record: dict[str, Any]) -> LLMCall | Reward:
    """Rebuild the LLMCall or Reward an export record was made from (ValueError for an unknown kind)."""
    kind = record.get("kind")
    fields = {key: value for key, value in record.items() if key != "kind"}
    if kind == LLM_CALL_KIND:
        fields["kind"] = fields.pop("call_kind")
        usage = fields.pop("usage")
        return LLMCall(**fields, usage=None if usage is None else Usage(**usage))
    if kind == REWARD_KIND:
        return Reward(**fields)
    raise ValueError(f"export record kind must be {LLM_CALL_KIND!r} or {REWARD_KIND!r}, got {kind!r}")


def _call_key(call: LLMCall) -> tuple[str, str, int, int, int]:
    # Mirrors the store's ordering index ('' for "none"; Python str order is code-point order, as
    # is SQLite's byte order on UTF-8); calls sort before a reward of the same sequence.
    return (call.rollout_id or "", call.attempt_id or "", call.sequence or 0, 0, call.choice_index)


def _reward_key(reward: Reward) -> tuple[str, str, int, int, int]:
    return (reward.rollout_id or "", reward.attempt_id or "", reward.sequence or 0, 1, 0)


async def merge_in_sequence(
    calls: AsyncIterator[LLMCall], rewards: AsyncIterator[Reward]
) -> AsyncIterator[LLMCall | Reward]:
    """Interleave two store streams (each in store order) into one, by (rollout, attempt, sequence).

    Holds one record of each stream at a time. Both streams are closed when this one is, even if
    the consumer stops early.
    """
    async with closing_stream(calls) as call_stream, closing_stream(rewards) as reward_stream:
        call = await anext(call_stream, None)
        reward = await anext(reward_stream, None)
        while call is not None or reward is not None:
            if reward is None or (call is not None and _call_key(call) <= _reward_key(reward)):
                assert call is not None  # the loop runs while one of them is not None
                yield call
                call = await anext(call_stream, None)
            else:
                yield reward
                reward = await anext(reward_stream, None)


async def rollout_has_records(store: Store, rollout_id: str) -> bool:
    """Whether `rollout_id` is a known rollout, or has calls or rewards (ingested for a rollout made elsewhere)."""
    if await store.get_rollout(rollout_id) is not None:
        return True
    async with closing_stream(store.iter_llm_calls(rollout_id)) as calls:
        async for _ in calls:
            return True
    async with closing_stream(store.iter_rewards(rollout_id)) as rewards:
        async for _ in rewards:
            return True
    return False


def iter_records(store: Store, rollout_id: str | None = None) -> AsyncIterator[LLMCall | Reward]:
    """Stream every call and reward (or those of one rollout) in export order (see the module doc)."""
    if rollout_id is None:
        return merge_in_sequence(store.iter_all_calls(), store.iter_all_rewards())
    return merge_in_sequence(store.iter_llm_calls(rollout_id), store.iter_rewards(rollout_id))


# One encoder for every record: compact, ASCII-only (valid UTF-8 even for lone surrogates), and
# allow_nan so that a -inf logprob round-trips instead of failing the whole export.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=True)


async def export_calls(
    store: Store,
    out: str | os.PathLike[str],
    *,
    rollout_id: str | None = None,
) -> ExportCounts:
    """Write every LLM call and reward (or one rollout's) to `out` as JSON Lines; return the counts.

    Streams: memory stays bounded by the store's read page size whatever the store holds.
    Raises RolloutNotFoundError for a rollout id the store knows nothing about, and
    ExportOutputError (before reading anything) when `out` cannot be written.
    """
    if rollout_id is not None and not await rollout_has_records(store, rollout_id):
        raise RolloutNotFoundError(rollout_id)
    calls = rewards = 0
    with atomic_output(out) as handle:
        async with closing_stream(iter_records(store, rollout_id)) as records:
            async for record in records:
                if isinstance(record, LLMCall):
                    handle.write(_ENCODER.encode(call_record(record)))
                    calls += 1
                else:
                    handle.write(_ENCODER.encode(reward_record(record)))
                    rewards += 1
                handle.write("\n")
    return ExportCounts(calls=calls, rewards=rewards)
