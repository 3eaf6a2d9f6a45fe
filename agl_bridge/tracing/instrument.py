"""OpenTelemetry setup for agent processes: stamp every span with its rollout, export it to the proxy.

Agent frameworks (CrewAI, agentops, OpenInference instrumentations) create spans that know nothing
about rollouts. `AttributeStampingSpanProcessor` writes `agl.rollout_id` / `agl.attempt_id` from
`current_rollout_ids()` onto each span as it starts, so the receiver files it under the right
rollout; `configure_agent_tracing` installs it together with a bounded `BatchSpanProcessor` that
exports to the proxy's `/v1/traces`.

With agentops: call `agentops.init(...)` first (it installs its own global TracerProvider), then
`configure_agent_tracing()`, which adds our processors to that provider. Nothing here imports
agentops or crewai.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from agl_bridge import semconv
from agl_bridge.tracing.context import (
    current_rollout,
    current_rollout_ids,
    env_api_key,
    env_endpoint,
    normalize_endpoint,
)


class AttributeStampingSpanProcessor(SpanProcessor):
    """On span start, sets `agl.rollout_id` / `agl.attempt_id` from the current rollout.

    A span that already carries `agl.rollout_id` (e.g. a reward emitted with an explicit
    rollout) is left as it is, attempt included, so a pair is never mixed from two sources.
    Spans started outside any rollout are left unattributed. Never raises into the caller.
    """

    def __init__(self) -> None:
        self._enabled = True

    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        """Stamp the rollout and attempt onto `span` unless it has a rollout id already."""
        if not self._enabled:
            return
        ids = current_rollout_ids()
        if ids is None:
            return
        existing = span.attributes
        if existing is not None and semconv.AGL_ROLLOUT_ID in existing:
            return
        rollout_id, attempt_id = ids
        span.set_attribute(semconv.AGL_ROLLOUT_ID, rollout_id)
        if attempt_id is not None:
            span.set_attribute(semconv.AGL_ATTEMPT_ID, attempt_id)

    def on_end(self, span: ReadableSpan) -> None:
        """Nothing to do when a span ends."""

    def shutdown(self) -> None:
        """Stop stamping (a provider cannot remove a processor, so it stays installed, inert)."""
        self._enabled = False

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered."""
        return True


class AgentBatchSpanProcessor(BatchSpanProcessor):
    """A bounded `BatchSpanProcessor` that leaves reward spans out.

    `emit_reward` delivers its span itself, synchronously, before returning. A second copy sent
    later by this exporter would be a no-op when the first arrived, but after a delivery that
    failed (and was reported as not recorded) it would store the reward late, out of order.
    """

    def on_end(self, span: ReadableSpan) -> None:
        """Queue the span for export unless it is a reward span."""
        if span.name == semconv.SPAN_REWARD:
            return
        super().on_end(span)


@dataclass(eq=False)
class AgentTracing:
    """What `configure_agent_tracing` installed; `shutdown()` flushes and disables it."""

    provider: TracerProvider
    traces_url: str
    stamping: AttributeStampingSpanProcessor
    batch: AgentBatchSpanProcessor
    _closed: bool = field(default=False, repr=False)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export every span queued so far; False if that did not finish in time."""
        return self.batch.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Export what is queued, then stop stamping and exporting. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.stamping.shutdown()
        self.batch.shutdown()
        with _REGISTRY_LOCK:
            installed = _REGISTRY.get(self.provider)
            if installed is not None and installed.get(self.traces_url) is self:
                del installed[self.traces_url]

    @property
    def is_shutdown(self) -> bool:
        """Whether `shutdown()` was called."""
        return self._closed


_REGISTRY_LOCK = threading.Lock()
_REGISTRY: weakref.WeakKeyDictionary[TracerProvider, dict[str, AgentTracing]] = weakref.WeakKeyDictionary()


def configure_agent_tracing(
    endpoint: str | None = None,
    api_key: str | None = None,
    provider: TracerProvider | None = None,
    *,
    max_queue_size: int = 2048,
    max_export_batch_size: int = 512,
    schedule_delay_millis: int = 1000,
    export_timeout_s: float = 10.0,
    gzip: bool = True,
) -> AgentTracing:
    """Stamp every span of `provider` with its rollout and export them to `{endpoint}/v1/traces`.

    Reward spans are not exported here: `emit_reward` delivers them itself (see
    `AgentBatchSpanProcessor`).

    endpoint: the proxy base URL (with or without `/v1`); default: the current rollout's, else
      `AGL_ENDPOINT`.
    api_key: sent as `Authorization: Bearer ...`; default `AGL_API_KEY`, else `OPENAI_API_KEY`.
    provider: an SDK TracerProvider; default the global one. If no SDK provider is installed
      globally yet, one is created and installed.
    max_queue_size: spans held for export at most; when the proxy cannot keep up, newer spans are
      dropped (and counted by the SDK) rather than growing memory without bound.

    Calling it again for the same provider and endpoint returns the installed handle.
    """
    for name, number in (
        ("max_queue_size", max_queue_size),
        ("max_export_batch_size", max_export_batch_size),
        ("schedule_delay_millis", schedule_delay_millis),
    ):
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            raise ValueError(f"{name} must be a positive integer, got {number!r}")
    if max_export_batch_size > max_queue_size:
        raise ValueError(
            f"max_export_batch_size ({max_export_batch_size}) cannot exceed max_queue_size ({max_queue_size})"
        )
    base, key = _resolve_target(endpoint, api_key)
    traces_url = base + semconv.OTLP_TRACES_PATH
    target = _resolve_provider(provider)
    with _REGISTRY_LOCK:
        installed = _REGISTRY.setdefault(target, {})
        existing = installed.get(traces_url)
        if existing is not None and not existing.is_shutdown:
            return existing
        exporter = OTLPSpanExporter(
            endpoint=traces_url,
            headers={"Authorization": f"Bearer {key}"} if key else None,
            timeout=export_timeout_s,
            compression=Compression.Gzip if gzip else Compression.NoCompression,
        )
        handle = AgentTracing(
            provider=target,
            traces_url=traces_url,
            stamping=AttributeStampingSpanProcessor(),
            batch=AgentBatchSpanProcessor(
                exporter,
                max_queue_size=max_queue_size,
                max_export_batch_size=max_export_batch_size,
                schedule_delay_millis=schedule_delay_millis,
            ),
        )
        # Processors installed earlier (agentops') see the stamp too: they read spans at on_end.
        target.add_span_processor(handle.stamping)
        target.add_span_processor(handle.batch)
        installed[traces_url] = handle
    return handle


def _resolve_target(endpoint: str | None, api_key: str | None) -> tuple[str, str | None]:
    rollout = current_rollout()
    if endpoint is None:
        endpoint = rollout.endpoint if rollout is not None else None
    if endpoint is None:
        endpoint = env_endpoint()
    if endpoint is None:
        raise ValueError(
            "configure_agent_tracing needs the proxy's base URL: pass endpoint='http://host:port' or set "
            f"{semconv.ENV_ENDPOINT}"
        )
    if api_key is None:
        api_key = rollout.api_key if rollout is not None and rollout.api_key else env_api_key()
    return normalize_endpoint(endpoint), api_key


def _resolve_provider(provider: TracerProvider | None) -> TracerProvider:
    if provider is not None:
        if not isinstance(provider, TracerProvider):
            raise TypeError(
                f"provider must be an opentelemetry.sdk.trace.TracerProvider (it needs add_span_processor), "
                f"got {type(provider).__name__}"
            )
        return provider
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current
    if isinstance(current, trace.ProxyTracerProvider):  # nothing installed yet: install an SDK provider
        trace.set_tracer_provider(TracerProvider(resource=Resource.create({})))
        # set_tracer_provider is ignored (with a warning) if another thread installed one first.
        current = trace.get_tracer_provider()
        if isinstance(current, TracerProvider):
            return current
    raise TypeError(
        f"the global TracerProvider is a {type(current).__name__}, not an SDK TracerProvider, so span "
        "processors cannot be added to it; pass provider=... explicitly"
    )
