"""Tracing: rollout context, `emit_reward`, the OTLP receiver, and agent-process instrumentation.

  - `context`: `RolloutContext`, `rollout_context(...)`, `current_rollout()`;
  - `rewards`: `emit_reward` / `emit_reward_async`, `set_reward_sink`;
  - `lifecycle`: `start_rollout` / `finish_rollout` for harnesses we do not launch (HTTP to the proxy);
  - `sinks`: `StoreSink` (store in this process), `RemoteSink` (OTLP/HTTP to the proxy);
  - `otlp`: OTLP protobuf/JSON → `Reward` / `StoredSpan` records;
  - `receiver`: `make_traces_router(store)`, the FastAPI router for `POST /v1/traces`;
  - `instrument`: `configure_agent_tracing()` and the span stamping processor.

`receiver` (FastAPI) and `instrument` (the HTTP exporter) are imported on first use, so agent
processes that only call `emit_reward` do not load a web framework.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agl_bridge.tracing.context import RolloutContext, current_rollout, rollout_context
from agl_bridge.tracing.lifecycle import LifecycleError, finish_rollout, start_rollout
from agl_bridge.tracing.otlp import DecodedSpan, OTLPDecodeError, decode_export_request
from agl_bridge.tracing.rewards import (
    NoRolloutError,
    emit_reward,
    emit_reward_async,
    get_reward_sink,
    set_reward_sink,
)
from agl_bridge.tracing.sinks import RemoteSink, RewardDeliveryError, RewardSink, StoreSink

if TYPE_CHECKING:
    from agl_bridge.tracing.instrument import AgentTracing, AttributeStampingSpanProcessor, configure_agent_tracing
    from agl_bridge.tracing.receiver import make_traces_router

_LAZY = {
    "AgentTracing": "agl_bridge.tracing.instrument",
    "AttributeStampingSpanProcessor": "agl_bridge.tracing.instrument",
    "configure_agent_tracing": "agl_bridge.tracing.instrument",
    "make_traces_router": "agl_bridge.tracing.receiver",
}


def __getattr__(name: str) -> Any:
    """Import the heavier parts (receiver, instrumentation) when first asked for."""
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)


__all__ = [
    "AgentTracing",
    "AttributeStampingSpanProcessor",
    "DecodedSpan",
    "LifecycleError",
    "NoRolloutError",
    "OTLPDecodeError",
    "RemoteSink",
    "RewardDeliveryError",
    "RewardSink",
    "RolloutContext",
    "StoreSink",
    "configure_agent_tracing",
    "current_rollout",
    "decode_export_request",
    "emit_reward",
    "emit_reward_async",
    "finish_rollout",
    "get_reward_sink",
    "make_traces_router",
    "rollout_context",
    "set_reward_sink",
    "start_rollout",
]
