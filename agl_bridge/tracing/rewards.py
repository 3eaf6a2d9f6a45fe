"""`emit_reward(x)`: record a reward span and deliver it to the store before returning.

What happens on `emit_reward(0.8, name="accuracy")`:
  1. The value is checked (a finite real number, not a bool) and the rollout is found: explicit
     `rollout_id`/`attempt_id` arguments, else the active `rollout_context`, else the
     `AGL_ROLLOUT_ID`/`AGL_ATTEMPT_ID` environment. No rollout → `NoRolloutError`; a reward is
     never dropped silently.
  2. An OpenTelemetry span named `agl.reward` (carrying `agl.reward.*` and the GenAI conventions'
     `gen_ai.evaluation.*` attributes) is started and ended on the *global* tracer
     provider, so every processor installed there (agentops, the user's own exporters,
     `configure_agent_tracing`) sees it as a child of the current span. When the global provider
     cannot produce a recording SDK span carrying our attributes unchanged (no SDK configured,
     sampled out, attribute limits), an equivalent span is built here instead.
  3. The span is delivered synchronously to one sink: the `StoreSink` registered with
     `set_reward_sink` (store in this process), else a `RemoteSink` for the rollout's endpoint
     (`AGL_ENDPOINT`). Delivery returns only after the store committed the reward and allocated its
     sequence number, so a reward emitted after an LLM call returned sorts after that call, and
     one emitted before a later call sorts before it.

`configure_agent_tracing`'s exporter leaves reward spans out, so a reward reaches the store by one
path only. Should another exporter still send the same span to the receiver, the store recognises
its span id and keeps the first copy (same sequence, no duplicate).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from agl_bridge import semconv
from agl_bridge._version import __version__
from agl_bridge.tracing.context import RolloutContext, current_rollout, env_api_key, env_endpoint
from agl_bridge.tracing.sinks import RemoteSink, RewardDeliveryError, RewardSink
from agl_bridge.types import DEFAULT_REWARD_NAME, finite_real


class NoRolloutError(RuntimeError):
    """`emit_reward` was called where no rollout is known, so the reward cannot be attributed."""


_SINK_LOCK = threading.Lock()
_sink: RewardSink | None = None


def set_reward_sink(sink: RewardSink | None) -> RewardSink | None:
    """Send every reward of this process to `sink` (None: back to the rollout's endpoint); returns the previous.

    Use a `StoreSink(store, loop)` when the store runs in this process (the trainer running the
    proxy in-process, tests). It takes precedence over `AGL_ENDPOINT` for all rollouts.
    """
    global _sink
    if sink is not None and not (hasattr(sink, "deliver") and hasattr(sink, "deliver_async")):
        raise TypeError(f"a reward sink needs deliver() and deliver_async() methods, got {sink!r}")
    with _SINK_LOCK:
        previous, _sink = _sink, sink
    return previous


def get_reward_sink() -> RewardSink | None:
    """The sink registered with `set_reward_sink`, or None."""
    return _sink


def emit_reward(
    value: float, name: str = DEFAULT_REWARD_NAME, *, rollout_id: str | None = None, attempt_id: str | None = None
) -> None:
    """Record a reward for the current rollout; returns once it is durably stored.

    value: a finite real number (int, float, numpy scalar; not bool, NaN or ±inf).
    name: which reward this is, when an agent emits several (default "reward").
    rollout_id / attempt_id: attribute to this rollout instead of the current one.

    Raises ValueError for a bad value or name, NoRolloutError when no rollout is known, and
    RewardDeliveryError when the reward could not be stored. From inside the event loop of an
    in-process store use `await emit_reward_async(...)`: this blocking call would deadlock it.
    """
    sink, attributes = _prepare(value, name, rollout_id, attempt_id)
    sink.deliver([_record_span(attributes)])


async def emit_reward_async(
    value: float, name: str = DEFAULT_REWARD_NAME, *, rollout_id: str | None = None, attempt_id: str | None = None
) -> None:
    """`emit_reward` for async code: same checks and guarantees, without blocking the event loop."""
    sink, attributes = _prepare(value, name, rollout_id, attempt_id)
    await sink.deliver_async([_record_span(attributes)])


def _prepare(
    value: object, name: object, rollout_id: str | None, attempt_id: str | None
) -> tuple[RewardSink, dict[str, str | float]]:
    """Check the arguments, find the rollout and the sink, and build the span attributes."""
    number = _check_value(value)
    if not isinstance(name, str) or not name:
        raise ValueError(f"emit_reward name must be a non-empty string, got {name!r}")
    rollout = resolve_rollout(rollout_id, attempt_id, value=value)
    sink = _sink
    if sink is None:
        if rollout.endpoint is None:
            raise RewardDeliveryError(
                f"emit_reward({value!r}) knows its rollout ({rollout.rollout_id!r}) but not where to deliver the "
                f"reward: set {semconv.ENV_ENDPOINT} to the proxy's base URL, pass endpoint=... to "
                "rollout_context(), or register the in-process store with set_reward_sink(StoreSink(store, loop)). "
                "The reward was not recorded."
            )
        sink = RemoteSink(rollout.endpoint, rollout.api_key)
    attributes: dict[str, str | float] = {
        semconv.AGL_ROLLOUT_ID: rollout.rollout_id,
        semconv.AGL_REWARD_NAME: name,
        semconv.AGL_REWARD_VALUE: number,
        # The same reward as the GenAI conventions' evaluation result, for OTel tooling that reads those.
        semconv.GEN_AI_EVALUATION_NAME: name,
        semconv.GEN_AI_EVALUATION_SCORE_VALUE: number,
        semconv.GEN_AI_CONVERSATION_ID: rollout.rollout_id,
    }
    if rollout.attempt_id is not None:
        attributes[semconv.AGL_ATTEMPT_ID] = rollout.attempt_id
    return sink, attributes


def _check_value(value: object) -> float:
    try:
        return finite_real("reward value", value)
    except ValueError:
        raise ValueError(
            f"emit_reward needs a finite real number (int or float, not bool, NaN or infinity), got {value!r} "
            f"of type {type(value).__name__}; convert tensors and arrays with float(x) or x.item()"
        ) from None


def resolve_rollout(rollout_id: str | None, attempt_id: str | None, *, value: object = None) -> RolloutContext:
    """The rollout a reward belongs to: explicit ids > `rollout_context` > environment.

    An explicit `rollout_id` without `attempt_id` takes the current attempt only when the current
    rollout is that same rollout. The endpoint and key always come from the context/environment.
    Raises NoRolloutError when none is known.
    """
    if attempt_id is not None and rollout_id is None:
        raise ValueError(
            f"emit_reward got attempt_id={attempt_id!r} without rollout_id; an attempt belongs to a rollout, "
            "so pass both (or neither, to use the current rollout)"
        )
    current = current_rollout()
    if rollout_id is None:
        if current is None:
            raise NoRolloutError(_no_rollout_message(value))
        return current
    if attempt_id is None and current is not None and current.rollout_id == rollout_id:
        attempt_id = current.attempt_id
    if current is not None:
        return RolloutContext(rollout_id, attempt_id, current.endpoint, current.api_key)
    return RolloutContext(rollout_id, attempt_id, env_endpoint(), env_api_key())


def _no_rollout_message(value: object) -> str:
    return (
        f"emit_reward({value!r}) does not know which rollout the reward belongs to, so it was not recorded. "
        "Provide the rollout in one of three ways: "
        "(1) run the agent inside `with agl_bridge.tracing.rollout_context(rollout_id, attempt_id, endpoint=...):` "
        "(the agl_bridge runner does this for in-process agents); "
        f"(2) set the environment variables {semconv.ENV_ROLLOUT_ID}, {semconv.ENV_ATTEMPT_ID} and "
        f"{semconv.ENV_ENDPOINT} (the runner does this for subprocess agents); "
        "(3) pass rollout_id=... (and attempt_id=...) to emit_reward."
    )


# --- the span -------------------------------------------------------------------------------------

_SCOPE = InstrumentationScope(semconv.TRACER_NAME, __version__)
_ids = RandomIdGenerator()
_resource: Resource | None = None


def _record_span(attributes: Mapping[str, str | float]) -> ReadableSpan:
    """Start and end the reward span on the global provider; build it here if that gives none usable."""
    tracer = trace.get_tracer(semconv.TRACER_NAME, __version__)
    span = tracer.start_span(semconv.SPAN_REWARD, kind=SpanKind.INTERNAL, attributes=attributes)
    span.end()
    if isinstance(span, ReadableSpan) and _carries(span, attributes):
        return span
    return _own_span(attributes)


def _carries(span: ReadableSpan, attributes: Mapping[str, str | float]) -> bool:
    # Attribute limits (OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT) or another processor could have cut or
    # changed our attributes; such a span must not be what attributes the reward.
    recorded = span.attributes or {}
    return all(recorded.get(key) == value for key, value in attributes.items())


def _own_span(attributes: Mapping[str, str | float]) -> ReadableSpan:
    """A finished reward span made without a tracer, as a child of the current span if there is one."""
    global _resource
    if _resource is None:
        _resource = Resource.create({})  # service.name and OTEL_RESOURCE_ATTRIBUTES, as an SDK provider would
    parent = trace.get_current_span().get_span_context()
    trace_id = parent.trace_id if parent.is_valid else _ids.generate_trace_id()
    context = SpanContext(
        trace_id, _ids.generate_span_id(), is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED)
    )
    now = time.time_ns()
    return ReadableSpan(
        name=semconv.SPAN_REWARD,
        context=context,
        parent=parent if parent.is_valid else None,
        resource=_resource,
        attributes=dict(attributes),
        kind=SpanKind.INTERNAL,
        start_time=now,
        end_time=now,
        instrumentation_scope=_SCOPE,
    )
