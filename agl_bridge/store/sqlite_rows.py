"""Records ⇄ SQLite rows: the column lists and the encoders/decoders between them.

Encoding happens in the caller's task before a record is queued, so a record that cannot be stored
(a non-JSON message, a token id outside int32) fails its own caller with a ValueError at once and
never reaches the shared write transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agl_bridge.store.codec import (
    decode_float64s,
    decode_int32s,
    decode_json,
    encode_float64s,
    encode_int32s,
    encode_json,
    float64_array,
    int32_array,
)
from agl_bridge.types import (
    Attempt,
    AttemptStatus,
    CallClass,
    LLMCall,
    Reward,
    Rollout,
    RolloutOrigin,
    RolloutStatus,
    StoredSpan,
    Usage,
)

NO_ID = ""
"""Stored in rollout_key/attempt_key for "no rollout" / "no attempt"."""

# The first three columns of the three record tables are the ordering key (rollout, attempt, sequence);
# writers prepend them to the encoded rest of the row once the sequence is known.
LLM_CALL_COLUMNS: tuple[str, ...] = (
    "rollout_key",
    "attempt_key",
    "sequence",
    "choice_index",
    "kind",
    "model",
    "prompt_token_ids",
    "response_token_ids",
    "response_logprobs",
    "token_policy_versions",
    "policy_version",
    "messages",
    "response_text",
    "finish_reason",
    "agent_name",
    "started_at",
    "ended_at",
    "prefix_breaks",
    "span_id",
    "trace_id",
    "input_tokens",
    "output_tokens",
    "declared_class",
    "declared_parent",
    "carries",
)
LLM_CALL_SELECT = ", ".join(LLM_CALL_COLUMNS)

REWARD_COLUMNS: tuple[str, ...] = (
    "rollout_key",
    "attempt_key",
    "sequence",
    "name",
    "value",
    "timestamp",
    "span_id",
    "trace_id",
)
REWARD_SELECT = ", ".join(REWARD_COLUMNS)

SPAN_COLUMNS: tuple[str, ...] = (
    "rollout_key",
    "attempt_key",
    "sequence",
    "name",
    "trace_id",
    "span_id",
    "parent_span_id",
    "kind",
    "start_time_ns",
    "end_time_ns",
    "attributes",
    "resource",
    "scope_name",
    "status",
    "status_message",
)
SPAN_SELECT = ", ".join(SPAN_COLUMNS)

ROLLOUT_COLUMNS: tuple[str, ...] = (
    "rollout_id",
    "group_id",
    "status",
    "task",
    "metadata",
    "attempts",
    "created_at",
    "updated_at",
    "origin",
    "eval",
    "consumed_step",
)
ROLLOUT_SELECT = ", ".join(ROLLOUT_COLUMNS)

ATTEMPT_COLUMNS: tuple[str, ...] = (
    "rollout_id",
    "attempt_id",
    "number",
    "status",
    "error",
    "traceback",
    "started_at",
    "ended_at",
)
ATTEMPT_SELECT = ", ".join(ATTEMPT_COLUMNS)


def key_of(rollout_id: str | None, attempt_id: str | None) -> tuple[str, str]:
    """The (rollout_key, attempt_key) sequence space of a record."""
    return (rollout_id or NO_ID, attempt_id or NO_ID)


def encode_llm_call_rest(call: LLMCall) -> tuple[Any, ...]:
    """Every llm_calls column after (rollout_key, attempt_key, sequence), in LLM_CALL_COLUMNS order."""
    usage = call.usage
    return (
        call.choice_index,
        call.kind,
        call.model,
        encode_int32s("prompt_token_ids", call.prompt_token_ids),
        encode_int32s("response_token_ids", call.response_token_ids),
        encode_float64s("response_logprobs", call.response_logprobs),
        encode_int32s("token_policy_versions", call.token_policy_versions),
        call.policy_version,
        encode_json("messages", call.messages),
        call.response_text,
        call.finish_reason,
        call.agent_name,
        call.started_at,
        call.ended_at,
        encode_json("prefix_breaks", call.prefix_breaks),
        call.span_id,
        call.trace_id,
        None if usage is None else usage.input_tokens,
        None if usage is None else usage.output_tokens,
        None if call.declared_class is None else call.declared_class.value,
        call.declared_parent,
        encode_json("carries", call.carries) if call.carries else None,
    )


_EMPTY_JSON_LIST = "[]"
_CALL_CLASSES = {member.value: member for member in CallClass}


def decode_call_class(stored: str | None) -> CallClass | None:
    """A stored declared class; None for none, and for a word this version does not know (a newer
    writer's class is read as undeclared, so the converter infers it, rather than failing the read)."""
    return None if stored is None else _CALL_CLASSES.get(stored)


def decode_llm_call(row: Sequence[Any]) -> LLMCall:
    """Build an LLMCall from a row selected with LLM_CALL_SELECT (messages NULL: left empty).

    The common empty lists skip the JSON parser: the converter decodes tens of thousands of calls
    per second.
    """
    (
        rollout_key,
        attempt_key,
        sequence,
        choice_index,
        kind,
        model,
        prompt_ids,
        response_ids,
        logprobs,
        versions,
        policy_version,
        messages,
        response_text,
        finish_reason,
        agent_name,
        started_at,
        ended_at,
        prefix_breaks,
        span_id,
        trace_id,
        input_tokens,
        output_tokens,
        declared_class,
        declared_parent,
        carries,
    ) = row
    return LLMCall(
        rollout_id=rollout_key or None,
        attempt_id=attempt_key or None,
        sequence=sequence,
        choice_index=choice_index,
        kind=kind,
        model=model,
        prompt_token_ids=decode_int32s(prompt_ids),
        response_token_ids=decode_int32s(response_ids),
        response_logprobs=decode_float64s(logprobs),
        token_policy_versions=decode_int32s(versions),
        policy_version=policy_version,
        messages=[] if messages is None else decode_json(messages),
        response_text=response_text,
        finish_reason=finish_reason,
        agent_name=agent_name,
        started_at=started_at,
        ended_at=ended_at,
        prefix_breaks=[] if prefix_breaks == _EMPTY_JSON_LIST else decode_json(prefix_breaks),
        span_id=span_id,
        trace_id=trace_id,
        usage=None if input_tokens is None else Usage(input_tokens=input_tokens, output_tokens=output_tokens),
        declared_class=decode_call_class(declared_class),
        declared_parent=declared_parent or None,
        carries=[] if carries is None else decode_json(carries),
    )


_TOKEN_CALL_COLUMNS = frozenset(
    {
        "rollout_key", "attempt_key", "sequence", "choice_index", "kind", "model", "prompt_token_ids",
        "response_token_ids", "response_logprobs", "token_policy_versions", "policy_version",
        "finish_reason", "agent_name", "prefix_breaks", "span_id", "declared_class", "declared_parent",
        "carries",
    }
)  # fmt: skip
TOKEN_CALL_SELECT = ", ".join(c if c in _TOKEN_CALL_COLUMNS else "NULL" for c in LLM_CALL_COLUMNS)
"""LLM_CALL_SELECT with only what token-level readers use; the other columns read as NULL."""


def decode_token_call(row: Sequence[Any]) -> LLMCall:
    """Build an LLMCall for token-level readers from a row selected with TOKEN_CALL_SELECT.

    The token fields are `array.array`s ("i" ids and versions, "d" logprobs): sequences that
    index, slice, compare and concatenate like lists (an array never equals a list, though), made
    without a Python object per element; messages are empty and the text, timing, trace and usage
    fields None. The declared class and parent are kept: the converter's rollout graph reads them.
    """
    (
        rollout_key, attempt_key, sequence, choice_index, kind, model, prompt_ids, response_ids, logprobs,
        versions, policy_version, _, _, finish_reason, agent_name, _, _, prefix_breaks, span_id, _, _, _,
        declared_class, declared_parent, carries,
    ) = row  # fmt: skip
    return LLMCall(
        rollout_id=rollout_key or None,
        attempt_id=attempt_key or None,
        sequence=sequence,
        choice_index=choice_index,
        kind=kind,
        model=model,
        prompt_token_ids=int32_array(prompt_ids),  # type: ignore[arg-type]
        response_token_ids=int32_array(response_ids),  # type: ignore[arg-type]
        response_logprobs=float64_array(logprobs),  # type: ignore[arg-type]
        token_policy_versions=int32_array(versions),  # type: ignore[arg-type]
        policy_version=policy_version,
        finish_reason=finish_reason,
        agent_name=agent_name,
        prefix_breaks=[] if prefix_breaks == _EMPTY_JSON_LIST else decode_json(prefix_breaks),
        span_id=span_id,
        declared_class=decode_call_class(declared_class),
        declared_parent=declared_parent or None,
        carries=[] if carries is None else decode_json(carries),
    )


def encode_reward_rest(reward: Reward) -> tuple[Any, ...]:
    """Every rewards column after (rollout_key, attempt_key, sequence), in REWARD_COLUMNS order."""
    return (reward.name, reward.value, reward.timestamp, reward.span_id, reward.trace_id)


def decode_reward(row: Sequence[Any]) -> Reward:
    """Build a Reward from a row selected with REWARD_SELECT."""
    rollout_key, attempt_key, sequence, name, value, timestamp, span_id, trace_id = row
    return Reward(
        rollout_id=rollout_key or None,
        attempt_id=attempt_key or None,
        sequence=sequence,
        name=name,
        value=value,
        timestamp=timestamp,
        span_id=span_id,
        trace_id=trace_id,
    )


def encode_span_rest(span: StoredSpan) -> tuple[Any, ...]:
    """Every spans column after (rollout_key, attempt_key, sequence), in SPAN_COLUMNS order."""
    return (
        span.name,
        span.trace_id,
        span.span_id,
        span.parent_span_id,
        span.kind,
        span.start_time_ns,
        span.end_time_ns,
        encode_json("span attributes", span.attributes),
        encode_json("span resource", span.resource),
        span.scope_name,
        span.status,
        span.status_message,
    )


def decode_span(row: Sequence[Any]) -> StoredSpan:
    """Build a StoredSpan from a row selected with SPAN_SELECT."""
    (
        rollout_key,
        attempt_key,
        sequence,
        name,
        trace_id,
        span_id,
        parent_span_id,
        kind,
        start_time_ns,
        end_time_ns,
        attributes,
        resource,
        scope_name,
        status,
        status_message,
    ) = row
    return StoredSpan(
        rollout_id=rollout_key or None,
        attempt_id=attempt_key or None,
        sequence=sequence,
        name=name,
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent_span_id,
        kind=kind,
        start_time_ns=start_time_ns,
        end_time_ns=end_time_ns,
        attributes=decode_json(attributes),
        resource=decode_json(resource),
        scope_name=scope_name,
        status=status,
        status_message=status_message,
    )


def decode_rollout(row: Sequence[Any]) -> Rollout:
    """Build a Rollout from a row selected with ROLLOUT_SELECT."""
    rollout_id, group_id, status, task, metadata, attempts, created_at, updated_at, origin, is_eval, consumed = row
    return Rollout(
        rollout_id=rollout_id,
        group_id=group_id,
        status=RolloutStatus(status),
        task=decode_json(task),
        metadata=decode_json(metadata),
        attempts=attempts,
        created_at=created_at,
        updated_at=updated_at,
        origin=RolloutOrigin(origin),
        eval=bool(is_eval),
        consumed_step=consumed,
    )


def decode_attempt(row: Sequence[Any]) -> Attempt:
    """Build an Attempt from a row selected with ATTEMPT_SELECT."""
    rollout_id, attempt_id, number, status, error, traceback, started_at, ended_at = row
    return Attempt(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        number=number,
        status=AttemptStatus(status),
        error=error,
        traceback=traceback,
        started_at=started_at,
        ended_at=ended_at,
    )
