"""The records every part of agl_bridge exchanges: LLM calls, rewards, spans, rollouts, attempts, trajectories.

These are plain dataclasses with cheap validation in `__post_init__` (shapes, ranges, the rollout
state machine). They know nothing about spans, HTTP or storage; `semconv` names the span
attributes they map to, and `store/` persists them.

Timestamps are float seconds since the Unix epoch. They are for humans and timeouts only:
ordering inside a (rollout, attempt) uses the store-allocated `sequence` (invariant 3).
"""

from __future__ import annotations

import decimal
import enum
import math
import numbers
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from agl_bridge import semconv

CallKind = Literal["token", "text"]
"""`"token"`: exact token ids and logprobs were recorded; `"text"`: text only (not trainable)."""

_CALL_KINDS = (semconv.CALL_KIND_TOKEN, semconv.CALL_KIND_TEXT)

DEFAULT_REWARD_NAME = "reward"
"""Name given to a reward when the agent does not name it."""


class InvalidTransitionError(ValueError):
    """A rollout or attempt was asked to move to a status its current status cannot reach."""

    def __init__(self, what: str, current: str, requested: str, allowed: tuple[str, ...]) -> None:
        allowed_text = ", ".join(allowed) if allowed else "none (it is final)"
        super().__init__(
            f"{what} cannot go from {current!r} to {requested!r}; allowed from {current!r}: {allowed_text}"
        )
        self.current = current
        self.requested = requested


class RolloutStatus(str, enum.Enum):
    """Where a rollout is in its life: queued → running → succeeded | failed | timed_out.

    `running → queued` is also legal: it puts a rollout back for a retry (e.g. after its runner
    died). The three outcomes are final.
    """

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"

    @property
    def is_final(self) -> bool:
        """True for succeeded, failed and timed_out: no transition leaves these."""
        return not _ROLLOUT_TRANSITIONS[self]

    def allowed_next(self) -> tuple[RolloutStatus, ...]:
        """The statuses this one may move to."""
        return _ROLLOUT_TRANSITIONS[self]

    def can_transition_to(self, new: RolloutStatus) -> bool:
        """Whether moving from this status to `new` is legal."""
        return new in _ROLLOUT_TRANSITIONS[self]

    def check_transition(self, new: RolloutStatus, rollout_id: str = "") -> None:
        """Raise `InvalidTransitionError` naming both statuses if `self → new` is illegal."""
        if not self.can_transition_to(new):
            what = f"rollout {rollout_id!r}" if rollout_id else "a rollout"
            raise InvalidTransitionError(what, self.value, new.value, tuple(s.value for s in self.allowed_next()))


_ROLLOUT_TRANSITIONS: dict[RolloutStatus, tuple[RolloutStatus, ...]] = {
    RolloutStatus.QUEUED: (RolloutStatus.RUNNING,),
    RolloutStatus.RUNNING: (
        RolloutStatus.SUCCEEDED,
        RolloutStatus.FAILED,
        RolloutStatus.TIMED_OUT,
        RolloutStatus.QUEUED,
    ),
    RolloutStatus.SUCCEEDED: (),
    RolloutStatus.FAILED: (),
    RolloutStatus.TIMED_OUT: (),
}


class AttemptStatus(str, enum.Enum):
    """Where one attempt of a rollout is: running → succeeded | failed | timed_out (final)."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"

    @property
    def is_final(self) -> bool:
        """True for the three outcomes."""
        return self is not AttemptStatus.RUNNING


def _check_id(name: str, value: object, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value:
        expected = "a non-empty string or None" if optional else "a non-empty string"
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def _check_count(name: str, value: object, *, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        expected = "an integer >= 0 or None" if optional else "an integer >= 0"
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def _check_attribution(rollout_id: object, attempt_id: object, sequence: object) -> None:
    _check_id("rollout_id", rollout_id, optional=True)
    _check_id("attempt_id", attempt_id, optional=True)
    if attempt_id is not None and rollout_id is None:
        raise ValueError(
            f"attempt_id {attempt_id!r} was given without a rollout_id; an attempt always belongs "
            "to a rollout, so pass both (or neither for a call outside any rollout)"
        )
    _check_count("sequence", sequence, optional=True)


def finite_real(name: str, value: object) -> float:
    """Return `value` as a float if it is a finite real number (not a bool), else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, decimal.Decimal)):
        raise ValueError(f"{name} must be a finite real number (int or float, not bool), got {value!r}")
    as_float = float(value)
    if not math.isfinite(as_float):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    return as_float


@dataclass(slots=True, kw_only=True)
class Usage:
    """Token counts of one call as reported to the client (OpenAI `usage`)."""

    input_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        _check_count("usage.input_tokens", self.input_tokens, optional=False)
        _check_count("usage.output_tokens", self.output_tokens, optional=False)


@dataclass(slots=True, kw_only=True)
class LLMCall:
    """One LLM call (one choice of one chat completion) with the exact tokens behind it.

    Attribution: `rollout_id`/`attempt_id` are None for calls made outside any rollout; those
    share one "no rollout" sequence space. `sequence` is allocated by the store; leave it None to
    have the store allocate it when the record is written.

    Tokens (kind "token"): `prompt_token_ids` are the ids the sampler consumed,
    `response_token_ids` the ids it sampled, `response_logprobs[i]` the sampler's logprob of
    `response_token_ids[i]`, and `token_policy_versions[i]` the policy version that sampled it
    (may be empty when unknown). `policy_version` is the oldest of those versions; it is derived
    from `token_policy_versions` when not given. Calls of kind "text" (models that return no
    token ids) carry no token lists and cannot be trained on.
    """

    rollout_id: str | None = None
    attempt_id: str | None = None
    sequence: int | None = None
    model: str
    kind: CallKind = "token"
    prompt_token_ids: list[int] = field(default_factory=list)
    response_token_ids: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    token_policy_versions: list[int] = field(default_factory=list)
    policy_version: int | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    response_text: str | None = None
    finish_reason: str | None = None
    agent_name: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    choice_index: int = 0
    prefix_breaks: list[Any] = field(default_factory=list)
    span_id: str | None = None
    trace_id: str | None = None
    usage: Usage | None = None

    def __post_init__(self) -> None:
        _check_attribution(self.rollout_id, self.attempt_id, self.sequence)
        if not isinstance(self.model, str):
            raise ValueError(f"model must be a string (the model name), got {self.model!r}")
        if self.kind not in _CALL_KINDS:
            raise ValueError(f"kind must be one of {_CALL_KINDS}, got {self.kind!r}")
        _check_count("choice_index", self.choice_index, optional=False)
        n_response = len(self.response_token_ids)
        if self.kind == semconv.CALL_KIND_TOKEN:
            if not self.prompt_token_ids:
                raise ValueError(
                    "a kind='token' call needs its prompt_token_ids; use kind='text' if none were recorded"
                )
            if len(self.response_logprobs) != n_response:
                raise ValueError(
                    f"response_logprobs has {len(self.response_logprobs)} entries but response_token_ids "
                    f"has {n_response}; each sampled token needs exactly one logprob"
                )
        elif self.prompt_token_ids or n_response or self.response_logprobs or self.token_policy_versions:
            raise ValueError("a kind='text' call carries no token lists; record the tokens with kind='token'")
        if self.token_policy_versions and len(self.token_policy_versions) != n_response:
            raise ValueError(
                f"token_policy_versions has {len(self.token_policy_versions)} entries but "
                f"response_token_ids has {n_response}; give one version per sampled token, or none"
            )
        if self.policy_version is None and self.token_policy_versions:
            self.policy_version = min(self.token_policy_versions)
        if self.policy_version is not None and (
            isinstance(self.policy_version, bool) or not isinstance(self.policy_version, int)
        ):
            raise ValueError(f"policy_version must be an integer or None, got {self.policy_version!r}")
        if self.usage is not None and not isinstance(self.usage, Usage):
            raise ValueError(f"usage must be a Usage record or None, got {self.usage!r}")

    @property
    def trainable(self) -> bool:
        """Whether this call has exact tokens to train on."""
        return self.kind == semconv.CALL_KIND_TOKEN


@dataclass(slots=True, kw_only=True)
class Reward:
    """One reward emitted by the agent (`emit_reward(value, name=...)`).

    `value` must be a finite real number; ints are stored as floats. A missing reward is never a
    zero: if the agent emits none, there is no Reward record. `sequence` is store-allocated in the
    same space as the LLM calls of its (rollout, attempt), so rewards order among the calls.
    """

    rollout_id: str | None = None
    attempt_id: str | None = None
    sequence: int | None = None
    value: float
    name: str = DEFAULT_REWARD_NAME
    timestamp: float = field(default_factory=time.time)
    span_id: str | None = None
    trace_id: str | None = None

    def __post_init__(self) -> None:
        _check_attribution(self.rollout_id, self.attempt_id, self.sequence)
        self.value = finite_real("reward value", self.value)
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"reward name must be a non-empty string, got {self.name!r}")
        self.timestamp = finite_real("reward timestamp", self.timestamp)


SpanStatus = Literal["unset", "ok", "error"]
"""OpenTelemetry span status code, lower-case."""

SpanKind = Literal["unspecified", "internal", "server", "client", "producer", "consumer"]
"""OpenTelemetry span kind, lower-case."""

_SPAN_STATUSES = ("unset", "ok", "error")
_SPAN_KINDS = ("unspecified", "internal", "server", "client", "producer", "consumer")
_HEX_DIGITS = frozenset("0123456789abcdef")
_MAX_NS = 2**63 - 1  # SQLite integers are signed 64-bit: nanoseconds up to the year 2262


def _check_hex_id(name: str, value: object, n_hex: int, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or len(value) != n_hex or not _HEX_DIGITS.issuperset(value) or value == "0" * n_hex:
        expected = f"{n_hex} lower-case hex digits, not all zero" + (" (or None)" if optional else "")
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def _check_ns(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_NS:
        raise ValueError(f"{name} must be an integer number of nanoseconds in [0, 2**63), got {value!r}")


@dataclass(slots=True, kw_only=True)
class StoredSpan:
    """A span that is neither an LLM call nor a reward (agent, tool, framework spans), as stored.

    Attribution comes from the span's `agl.rollout_id` / `agl.attempt_id` attributes, else from its
    resource's. `sequence` is store-allocated at ingest in the same space as the calls and rewards
    of its (rollout, attempt): it orders spans by when they reached the store, which for batched
    exporters can be seconds after they ended; `start_time_ns` / `end_time_ns` are the span's own
    (agent-clock) times. `attributes` and `resource` are JSON-safe dicts (see tracing/otlp.py for
    how OTLP values map onto JSON). Ids are lower-case hex: trace 32 digits, span 16.
    """

    rollout_id: str | None = None
    attempt_id: str | None = None
    sequence: int | None = None
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str | None = None
    kind: SpanKind = "internal"
    start_time_ns: int
    end_time_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    resource: dict[str, Any] = field(default_factory=dict)
    scope_name: str | None = None
    status: SpanStatus = "unset"
    status_message: str | None = None

    def __post_init__(self) -> None:
        _check_attribution(self.rollout_id, self.attempt_id, self.sequence)
        if not isinstance(self.name, str):
            raise ValueError(f"span name must be a string, got {self.name!r}")
        _check_hex_id("trace_id", self.trace_id, 32, optional=False)
        _check_hex_id("span_id", self.span_id, 16, optional=False)
        _check_hex_id("parent_span_id", self.parent_span_id, 16, optional=True)
        if self.kind not in _SPAN_KINDS:
            raise ValueError(f"span kind must be one of {_SPAN_KINDS}, got {self.kind!r}")
        _check_ns("start_time_ns", self.start_time_ns)
        _check_ns("end_time_ns", self.end_time_ns)
        if not isinstance(self.attributes, dict) or not isinstance(self.resource, dict):
            raise ValueError(
                f"span attributes and resource must be dicts, got {type(self.attributes).__name__} "
                f"and {type(self.resource).__name__}"
            )
        if self.scope_name is not None and not isinstance(self.scope_name, str):
            raise ValueError(f"scope_name must be a string or None, got {self.scope_name!r}")
        if self.status not in _SPAN_STATUSES:
            raise ValueError(f"span status must be one of {_SPAN_STATUSES}, got {self.status!r}")
        if self.status_message is not None and not isinstance(self.status_message, str):
            raise ValueError(f"status_message must be a string or None, got {self.status_message!r}")


@dataclass(slots=True, kw_only=True)
class Rollout:
    """One run of the agent on one task; GRPO groups rollouts of the same task by `group_id`.

    `task` is the JSON-able payload handed to the agent. `attempts` counts the attempts started
    so far (retries included).
    """

    rollout_id: str
    task: Any
    group_id: str | None = None
    status: RolloutStatus = RolloutStatus.QUEUED
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    attempts: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_id("rollout_id", self.rollout_id, optional=False)
        _check_id("group_id", self.group_id, optional=True)
        self.status = RolloutStatus(self.status)
        _check_count("attempts", self.attempts, optional=False)
        if not isinstance(self.metadata, dict):
            raise ValueError(f"metadata must be a dict, got {self.metadata!r}")


@dataclass(slots=True, kw_only=True)
class Attempt:
    """One try at running a rollout; a retry is a new attempt with the next `number` (from 1)."""

    rollout_id: str
    attempt_id: str
    number: int
    status: AttemptStatus = AttemptStatus.RUNNING
    error: str | None = None
    traceback: str | None = None
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None

    def __post_init__(self) -> None:
        _check_id("rollout_id", self.rollout_id, optional=False)
        _check_id("attempt_id", self.attempt_id, optional=False)
        if isinstance(self.number, bool) or not isinstance(self.number, int) or self.number < 1:
            raise ValueError(f"attempt number must be an integer >= 1, got {self.number!r}")
        self.status = AttemptStatus(self.status)


@dataclass(slots=True, kw_only=True)
class AttemptRecords:
    """One attempt with its LLM calls and rewards, each list in (sequence, choice_index) order."""

    attempt: Attempt
    calls: list[LLMCall] = field(default_factory=list)
    rewards: list[Reward] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class RolloutRecords:
    """One rollout as a store walk hands it over: its attempts (by number) with their records.

    `other_calls` / `other_rewards` are the rollout's records that belong to none of its attempts:
    made outside any attempt (`attempt_id` None), or naming an attempt the store has no row for.
    """

    rollout: Rollout
    attempts: list[AttemptRecords] = field(default_factory=list)
    other_calls: list[LLMCall] = field(default_factory=list)
    other_rewards: list[Reward] = field(default_factory=list)


# --- trajectories (what the converter makes of an attempt; schema: docs/trajectories.md) ------------


class DropReason(str, enum.Enum):
    """Why an attempt produced no trajectory; the keys of `ConversionReport.dropped`."""

    FAILED = "failed"
    """The attempt (or its rollout) failed: never trained on."""
    TIMED_OUT = "timed_out"
    """The attempt (or its rollout) timed out: never trained on."""
    NOT_FINISHED = "not_finished"
    """The attempt is still running, or its rollout is not final yet (rewards may still arrive)."""
    MISSING_REWARD = "missing_reward"
    """No reward was recorded and the policy is `missing_reward="drop"`."""
    NO_TRAINABLE_CALLS = "no_trainable_calls"
    """No call of the attempt is a selected token-level call."""


class SplitKind(str, enum.Enum):
    """Why a segment starts a new token sequence instead of continuing an earlier one."""

    NOT_EXTENDING = "not_extending"
    """The prompt is not the previous prompt + response followed by more tokens."""
    PREFIX_BREAK = "prefix_break"
    """As NOT_EXTENDING, and the proxy recorded why (the chat template re-rendered an earlier turn)."""
    MODEL_CHANGED = "model_changed"
    """The tokens extend, but another model made the call; a segment holds one model's samples."""
    CHOICE_BRANCH = "choice_branch"
    """Choice k > 0 of an n > 1 request: its own branch (only the first choice continues in place)."""


@dataclass(slots=True, kw_only=True)
class SegmentCall:
    """Where one LLM call sits in a segment: its response is `input_ids[response_start:response_end]`.

    Its prompt is exactly `input_ids[:response_start]` (that is what merging guarantees), so the
    observation tokens between this call and the one before it in the segment are
    `input_ids[previous.response_end:response_start]`. `rewards` are the rewards attributed to
    this call, summed by name.
    """

    sequence: int
    choice_index: int
    response_start: int
    response_end: int
    agent_name: str | None = None
    finish_reason: str | None = None
    span_id: str | None = None
    rewards: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # One cheap test for the common case: the converter builds tens of thousands per second.
        sequence, choice, start, end = self.sequence, self.choice_index, self.response_start, self.response_end
        if (
            not (type(sequence) is int and type(choice) is int and type(start) is int and type(end) is int)
            or min(sequence, choice, start) < 0
        ):
            _check_count("sequence", self.sequence, optional=False)
            _check_count("choice_index", self.choice_index, optional=False)
            _check_count("response_start", self.response_start, optional=False)
            _check_count("response_end", self.response_end, optional=False)
        if self.response_end < self.response_start:
            raise ValueError(
                f"response_end ({self.response_end}) is before response_start ({self.response_start}) "
                f"for the call at sequence {self.sequence}"
            )


@dataclass(slots=True, kw_only=True)
class TrajectorySegment:
    """One training sequence ("datum"): full token ids with per-token mask, logprobs and versions.

    All four lists have one entry per token. `loss_mask` is 1 on sampled tokens and 0 on prompt
    and observation tokens; `sampler_logprobs` is the sampler's logprob on sampled tokens and 0.0
    where the mask is 0 (never NaN: 0 x NaN is NaN, which would poison a masked sum);
    `policy_versions` is the version that sampled each token, -1 where the mask is 0 (or where the
    version is unknown). `calls` are the LLM calls merged into it, in order. `split_kind` and
    `split_reason` say why this segment did not continue an earlier one (None for the first).
    """

    input_ids: list[int]
    loss_mask: list[int]
    sampler_logprobs: list[float]
    policy_versions: list[int]
    model: str
    calls: list[SegmentCall]
    split_kind: SplitKind | None = None
    split_reason: str | None = None

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        for name in ("loss_mask", "sampler_logprobs", "policy_versions"):
            length = len(getattr(self, name))
            if length != n:
                raise ValueError(
                    f"segment {name} has {length} entries but input_ids has {n}; every list needs one entry per token"
                )
        if not self.calls:
            raise ValueError("a segment needs at least one call (the one whose tokens it holds)")
        if self.calls[-1].response_end > n:
            raise ValueError(
                f"the last call's response ends at token {self.calls[-1].response_end}, past the segment's {n} tokens"
            )
        if self.split_kind is not None:
            self.split_kind = SplitKind(self.split_kind)

    @property
    def num_sampled(self) -> int:
        """Tokens the policy sampled (mask 1) in this segment."""
        return sum(call.response_end - call.response_start for call in self.calls)


@dataclass(slots=True, kw_only=True)
class Trajectory:
    """What one succeeded attempt trains on: its segments plus the rewards that score them.

    `rewards` sums every reward of the attempt by name; `reward` is the return, the weighted sum
    of `rewards` (see `ConvertOptions.reward_weights`). `unattached_rewards` are the part of
    `rewards` attributed to no call (emitted before the first trainable call, or recorded for the
    rollout outside any attempt). `missing_reward` is True when no reward was recorded and the
    policy `missing_reward="zero"` gave it a return of 0.0. GRPO groups trajectories by
    `group_id` (the rollouts of one task in one step).
    """

    rollout_id: str
    attempt_id: str
    group_id: str | None = None
    task: Any = None
    reward: float
    rewards: dict[str, float] = field(default_factory=dict)
    unattached_rewards: dict[str, float] = field(default_factory=dict)
    missing_reward: bool = False
    segments: list[TrajectorySegment]

    def __post_init__(self) -> None:
        _check_id("rollout_id", self.rollout_id, optional=False)
        _check_id("attempt_id", self.attempt_id, optional=False)
        _check_id("group_id", self.group_id, optional=True)
        self.reward = finite_real("trajectory reward", self.reward)
        if not self.segments:
            raise ValueError(
                f"trajectory of rollout {self.rollout_id!r} attempt {self.attempt_id!r} has no segments; "
                "an attempt with nothing to train on is dropped, not converted"
            )

    @property
    def num_calls(self) -> int:
        """LLM calls merged into this trajectory's segments."""
        return sum(len(segment.calls) for segment in self.segments)


@dataclass(slots=True, kw_only=True)
class ConversionReport:
    """What a conversion did: attempts converted or dropped (by `DropReason`), segments, splits.

    `calls_not_trained` counts calls by reason: "text" (no token ids), "not_selected" (another
    model or agent than the options select), "dropped_attempt" (in an attempt that produced no
    trajectory), "outside_attempt" (a rollout's calls made outside any of its attempts).
    `rewards_ignored` counts rewards naming an attempt the store has no row for.
    """

    rollouts_seen: int = 0
    attempts_seen: int = 0
    attempts_converted: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    segments: int = 0
    splits: dict[str, int] = field(default_factory=dict)
    calls_seen: int = 0
    calls_trained: int = 0
    calls_not_trained: dict[str, int] = field(default_factory=dict)
    rewards_seen: int = 0
    rewards_ignored: int = 0
    missing_reward_zeroed: int = 0

    @property
    def attempts_dropped(self) -> int:
        """Attempts that produced no trajectory, whatever the reason."""
        return sum(self.dropped.values())

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict of every count."""
        return {
            "rollouts_seen": self.rollouts_seen,
            "attempts_seen": self.attempts_seen,
            "attempts_converted": self.attempts_converted,
            "attempts_dropped": self.attempts_dropped,
            "dropped": dict(self.dropped),
            "segments": self.segments,
            "splits": dict(self.splits),
            "calls_seen": self.calls_seen,
            "calls_trained": self.calls_trained,
            "calls_not_trained": dict(self.calls_not_trained),
            "rewards_seen": self.rewards_seen,
            "rewards_ignored": self.rewards_ignored,
            "missing_reward_zeroed": self.missing_reward_zeroed,
        }
