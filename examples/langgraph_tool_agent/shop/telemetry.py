"""An episode's outcome recorded in its rollout: one OpenTelemetry span, `shop.episode`, with the reward and
its reason as attributes (`Outcome.attributes`).

The span goes through `agl_bridge.tracing.configure_agent_tracing`: stamped with the rollout it ran in and
exported to the proxy's `/v1/traces`, which stores it with the rollout's calls and rewards (the viewer's
timeline shows it; `Store.iter_spans` reads it). The tracer provider is the example's own, not the global
one: with a global SDK provider the proxy's mirror span of every model call would be recorded and exported
too, messages and all.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span

EPISODE_SPAN = "shop.episode"

_PROVIDER = TracerProvider(resource=Resource.create({"service.name": "langgraph-shop-agent"}))


@contextmanager
def episode_span(endpoint: Any) -> Iterator[Span]:
    """A span around one episode, exported to `endpoint`'s proxy (and flushed) when the episode ends.

    The exporter is one per proxy and process, sending the key `emit_reward` uses (`endpoint.reward_key`: the
    harness's where the runner gives it, as to an agent run in its process); an agent run as a command, one
    episode per process, sends its own attempt's key.
    """
    from agl_bridge.tracing import configure_agent_tracing

    key = getattr(endpoint, "reward_key", None) or endpoint.api_key
    tracing = configure_agent_tracing(endpoint=endpoint.server_url, api_key=key, provider=_PROVIDER)
    try:
        with _PROVIDER.get_tracer("shop").start_as_current_span(EPISODE_SPAN) as span:
            yield span
    finally:
        tracing.force_flush(10_000)  # stored before the rollout is converted and the run reads it back
