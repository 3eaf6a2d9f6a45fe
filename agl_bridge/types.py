"""The records every part of agl_bridge exchanges: LLM calls, rewards, spans, rollouts, attempts.

These are plain dataclasses with cheap validation in `__post_init__` (shapes, ranges, the rollout
state machine). They know nothing about spans, HTTP or storage; `semconv` names the span
attributes they map to, and `store/` persists them. What the converter makes of them (trajectories)
lives with the converter, in `agl_bridge.convert.records`.

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


class CallClass(str, enum.Enum):
    """What a recorded call was to its attempt; decides whether it trains (docs/trajectories.md, "What trains").

    Declared by the agent or harness (header `x-agl-call-class`) or inferred by the converter from
    the attempt's recorded token structure (`agl_bridge.convert.graph`).
    """

    MAIN = semconv.CALL_CLASS_MAIN
    RETRY = semconv.CALL_CLASS_RETRY
    SIDE = semconv.CALL_CLASS_SIDE
    COMPACTION = semconv.CALL_CLASS_COMPACTION
    SUBAGENT = semconv.CALL_CLASS_SUBAGENT


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


def check_id(name: str, value: object, *, optional: bool) -> None:
    """Raise ValueError naming `name` unless `value` is a non-empty string (or None when `optional`)."""
    if value is None and optional:
        return
    if not isinstance(value, str) or not value:
        expected = "a non-empty string or None" if optional else "a non-empty string"
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def check_count(name: str, value: object, *, optional: bool) -> None:
    """Raise ValueError naming `name` unless `value` is an integer >= 0, not a bool (or None when `optional`)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        expected = "an integer >= 0 or None" if optional else "an integer >= 0"
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def _check_attribution(rollout_id: object, attempt_id: object, sequence: object) -> None:
    check_id("rollout_id", rollout_id, optional=True)
    check_id("attempt_id", attempt_id, optional=True)
    if attempt_id is not None and rollout_id is None:
        raise ValueError(
            f"attempt_id {attempt_id!r} was given without a rollout_id; an attempt always belongs "
            "to a rollout, so pass both (or neither for a call outside any rollout)"
        )
    check_count("sequence", sequence, optional=True)


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
        check_count("usage.input_tokens", self.input_tokens, optional=False)
        check_count("usage.output_tokens", self.output_tokens, optional=False)


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

    `declared_class` / `declared_parent` are what the agent or harness declared for this call
    (headers `x-agl-call-class` / `x-agl-parent-call`): the class wins over the converter's
    inference; the parent is an earlier call's store sequence as decimal text when the proxy
    resolved it, else the raw value sent (an unknown parent, reported by the converter).
    `carries` are the store sequences of earlier calls of the attempt whose answer text this
    request sent back inside a message of another role (a summary in a user message, a
    sub-agent's answer as a tool result): the proxy finds them by text, which survives the
    answer being tokenized anew; the converter's rollout graph reads them.
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
    declared_class: CallClass | None = None
    declared_parent: str | None = None
    carries: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check_attribution(self.rollout_id, self.attempt_id, self.sequence)
        if self.declared_class is not None and type(self.declared_class) is not CallClass:
            try:
                self.declared_class = CallClass(self.declared_class)
            except ValueError:
                raise ValueError(
                    f"declared_class must be one of {', '.join(semconv.CALL_CLASSES)} or None, "
                    f"got {self.declared_class!r}"
                ) from None
        if self.declared_parent is not None and (not isinstance(self.declared_parent, str) or not self.declared_parent):
            raise ValueError(f"declared_parent must be a non-empty string or None, got {self.declared_parent!r}")
        if not isinstance(self.model, str):
            raise ValueError(f"model must be a string (the model name), got {self.model!r}")
        if self.kind not in _CALL_KINDS:
            raise ValueError(f"kind must be one of {_CALL_KINDS}, got {self.kind!r}")
        check_count("choice_index", self.choice_index, optional=False)
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


class RolloutOrigin(str, enum.Enum):
    """Who started a rollout: our runner (`Store.create_rollout`), or a client we do not launch."""

    RUNNER = "runner"
    """Created with `create_rollout` (the runner, or any code using the store API) before it ran."""
    EXTERNAL = "external"
    """Registered by its first call, reward or lifecycle request (an agent or harness we do not launch)."""


@dataclass(slots=True, kw_only=True)
class Rollout:
    """One run of the agent on one task; GRPO groups rollouts of the same task by `group_id`.

    `task` is the JSON-able payload handed to the agent. `attempts` counts the attempts started
    so far (retries included). For an external rollout, `group_id` is the task id its harness
    named (None until it names one) and `task` the task metadata it sent (else the task id).
    `eval` marks a held-out rollout (evaluated, never trained); `consumed_step` is the training
    step of the follow trainer that took it (trained, or dropped as too stale), None until then.
    """

    rollout_id: str
    task: Any
    group_id: str | None = None
    status: RolloutStatus = RolloutStatus.QUEUED
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    attempts: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    origin: RolloutOrigin = RolloutOrigin.RUNNER
    eval: bool = False
    consumed_step: int | None = None

    def __post_init__(self) -> None:
        check_id("rollout_id", self.rollout_id, optional=False)
        check_id("group_id", self.group_id, optional=True)
        self.status = RolloutStatus(self.status)
        self.origin = RolloutOrigin(self.origin)
        check_count("attempts", self.attempts, optional=False)
        check_count("consumed_step", self.consumed_step, optional=True)
        if not isinstance(self.metadata, dict):
            raise ValueError(f"metadata must be a dict, got {self.metadata!r}")
        if not isinstance(self.eval, bool):
            raise ValueError(f"eval must be true or false, got {self.eval!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutTask:
    """What a harness says about the rollout it runs: the task, its metadata, whether it is held out.

    task_id: names the task; the rollouts of one task form one GRPO group (stored as `group_id`).
    metadata: the JSON-able task payload (stored as the rollout's `task`; default: the task id).
    eval: True for a held-out rollout, evaluated and never trained; None leaves the flag as it is.
    """

    task_id: str | None = None
    metadata: Any = None
    eval: bool | None = None

    def __post_init__(self) -> None:
        check_id("task_id", self.task_id, optional=True)
        if self.eval is not None and not isinstance(self.eval, bool):
            raise ValueError(f"eval must be true, false or null, got {self.eval!r}")


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
        check_id("rollout_id", self.rollout_id, optional=False)
        check_id("attempt_id", self.attempt_id, optional=False)
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
