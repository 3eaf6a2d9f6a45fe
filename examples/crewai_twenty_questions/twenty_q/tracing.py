"""CrewAI's own spans (crew, task, agent, tool) into the rollout, through agentops' OTel instrumentation.

agentops instruments CrewAI (`Crew.kickoff`, `Task.execute_sync`, `Agent.execute_task`,
`ToolUsage.use`, `LLM.call`) with OpenTelemetry spans. Without an API key it sends nothing, but its
`init()` installs a global TracerProvider whose exporter targets its cloud: both its API and its
exporter are pointed at a closed loopback port, so nothing leaves the machine. Then
`configure_agent_tracing()` adds agl_bridge's processors to that provider: every span is stamped
with the rollout it ran in and exported to the proxy's `/v1/traces`.

CrewAI must be imported before `agentops.init()` (else agentops' CrewAI instrumentation fails on a
circular import), which importing `crewai` at the top of this module guarantees.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import crewai  # noqa: F401  (imported before agentops on purpose; see the module docstring)

logger = logging.getLogger(__name__)

# A port nothing listens on: agentops' API and exporter calls fail at once, locally.
CLOSED_LOOPBACK = "http://127.0.0.1:9"

_LOCK = threading.Lock()
_AGENTOPS_READY: bool | None = None


def init_agentops() -> bool:
    """Initialise agentops once per process, offline; False (with a warning) if it cannot be."""
    global _AGENTOPS_READY
    with _LOCK:
        if _AGENTOPS_READY is None:
            try:
                import agentops

                agentops.init(
                    api_key=None,
                    endpoint=CLOSED_LOOPBACK,
                    app_url=CLOSED_LOOPBACK,
                    exporter_endpoint=f"{CLOSED_LOOPBACK}/v1/traces",
                    auto_start_session=False,
                    skip_auto_end_session=True,
                    instrument_llm_calls=True,
                    log_session_replay_url=False,
                    env_data_opt_out=True,
                    fail_safe=True,
                    log_level="WARNING",
                )
                _stop_agentops_cloud_export()
                _AGENTOPS_READY = True
            except Exception as error:  # tracing is an extra: a game must run without it
                logger.warning("agentops could not be initialised (%s); CrewAI spans will not be recorded", error)
                _AGENTOPS_READY = False
        return _AGENTOPS_READY


def _stop_agentops_cloud_export() -> None:
    """Switch off agentops' two cloud senders; the provider it installed stays, and ours is added next.

    Its exporting processor can only fail without a key (and logs each failure); its internal
    processor's one job is to upload agentops' log file when the first root span ends (three
    retries against the closed port). The SDK has no public way to list a provider's processors,
    hence the private attributes. agentops also replaces `print` with one that copies every line
    into an in-memory buffer for that upload; with no upload the buffer would only grow for the
    whole run, so the original `print` is put back.
    """
    import builtins

    from agentops.logging import instrument_logging
    from opentelemetry import trace

    original_print = getattr(instrument_logging, "_original_print", None)
    if original_print is not None:
        builtins.print = original_print
    provider = trace.get_tracer_provider()
    processors = getattr(getattr(provider, "_active_span_processor", None), "_span_processors", ())
    for processor in processors:
        exporter = getattr(processor, "span_exporter", None) or getattr(
            getattr(processor, "_batch_processor", None), "_exporter", None
        )
        if type(exporter).__module__.startswith("agentops"):
            processor.shutdown()
        elif type(processor).__name__ == "InternalSpanProcessor":
            processor.on_end = lambda span: None  # type: ignore[method-assign]


def enable_crewai_tracing(endpoint: Any) -> Any | None:
    """agentops' CrewAI spans, stamped with the rollout and exported to the proxy of `endpoint`.

    Returns the `AgentTracing` handle (flush it at the end of a game), or None when tracing is off.
    Calling it again for the same proxy returns the same handle.
    """
    if os.environ.get("TWENTYQ_TRACING", "1").lower() in ("0", "false", "no") or not init_agentops():
        return None
    from agl_bridge.tracing import configure_agent_tracing

    # One exporter serves every game this process plays, so it needs a key that reaches every attempt:
    # the harness's key where the runner gives it (a function agent runs in the runner's process), else
    # the attempt's own agent key (an agent run as a command plays one game per process).
    key = getattr(endpoint, "reward_key", None) or endpoint.api_key
    try:
        return configure_agent_tracing(endpoint=endpoint.server_url, api_key=key)
    except Exception as error:
        logger.warning("agl_bridge tracing could not be configured (%s); CrewAI spans will not be recorded", error)
        return None
