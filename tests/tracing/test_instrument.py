"""Agent-process instrumentation: the stamping processor and configure_agent_tracing → the receiver."""

from __future__ import annotations

import contextvars
import threading

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from shared_helpers import collect
from tracing_helpers import CapturingSink, ReceiverServer

from agl_bridge import emit_reward, semconv
from agl_bridge.tracing import AttributeStampingSpanProcessor, configure_agent_tracing, rollout_context


def test_stamping_processor_attributes_spans_from_the_current_rollout(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(AttributeStampingSpanProcessor())
    provider.add_span_processor(SimpleSpanProcessor(seen))
    tracer = provider.get_tracer("framework")
    with rollout_context("ro-1", "at-1"):
        with tracer.start_as_current_span("agent.step"):
            pass
        with tracer.start_as_current_span("explicit", attributes={semconv.AGL_ROLLOUT_ID: "ro-other"}):
            pass
    with tracer.start_as_current_span("outside"):
        pass
    monkeypatch.setenv(semconv.ENV_ROLLOUT_ID, "ro-env")
    with tracer.start_as_current_span("subprocess-style"):
        pass
    attrs = {span.name: dict(span.attributes or {}) for span in seen.get_finished_spans()}
    assert attrs["agent.step"] == {semconv.AGL_ROLLOUT_ID: "ro-1", semconv.AGL_ATTEMPT_ID: "at-1"}
    assert attrs["explicit"] == {semconv.AGL_ROLLOUT_ID: "ro-other"}  # not overwritten, attempt not mixed in
    assert attrs["outside"] == {}
    assert attrs["subprocess-style"] == {semconv.AGL_ROLLOUT_ID: "ro-env"}


async def test_configured_tracing_delivers_stamped_framework_spans_to_the_receiver(
    receiver: ReceiverServer,
) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "crew"}))
    handle = configure_agent_tracing(endpoint=receiver.url, provider=provider, schedule_delay_millis=50)
    assert configure_agent_tracing(endpoint=receiver.url + "/v1", provider=provider) is handle  # no double export
    tracer = provider.get_tracer("openinference.instrumentation.crewai")
    with rollout_context("ro-s", "at-s"):
        with tracer.start_as_current_span("crew.kickoff"):
            with tracer.start_as_current_span("agent.step"):
                pass
            copied = contextvars.copy_context()
            worker = threading.Thread(target=copied.run, args=(lambda: tracer.start_span("tool.call").end(),))
            worker.start()
            worker.join()
    with rollout_context("ro-t"):
        tracer.start_span("other.rollout").end()
    tracer.start_span("no.rollout").end()
    assert handle.force_flush(10_000)
    async with receiver.reader() as reader:
        in_rollout = await collect(reader.iter_spans("ro-s", "at-s"))
        other = await collect(reader.iter_spans("ro-t"))
        everything = await collect(reader.iter_all_spans())
    assert sorted(s.name for s in in_rollout) == ["agent.step", "crew.kickoff", "tool.call"]
    assert all(s.resource["service.name"] == "crew" for s in in_rollout)
    assert all(s.scope_name == "openinference.instrumentation.crewai" for s in in_rollout)
    kickoff = next(s for s in in_rollout if s.name == "crew.kickoff")
    assert {s.parent_span_id for s in in_rollout if s.name != "crew.kickoff"} == {kickoff.span_id}
    assert [(s.name, s.attempt_id) for s in other] == [("other.rollout", None)]
    unattributed = [s for s in everything if s.rollout_id is None]
    assert [s.name for s in unattributed] == ["no.rollout"]
    handle.shutdown()
    assert handle.is_shutdown
    tracer.start_span("after.shutdown").end()  # neither stamped nor exported, and no error


async def test_configured_exporter_leaves_reward_spans_to_emit_reward(
    receiver: ReceiverServer, capturing_sink: CapturingSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In an agent process the global provider would be this one. emit_reward delivers the reward
    # itself (here to a capturing sink); the batch exporter must not send a second, later copy.
    provider = TracerProvider()
    seen = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(seen))
    handle = configure_agent_tracing(endpoint=receiver.url, provider=provider, schedule_delay_millis=50)
    # The process-wide provider can be set only once, so stand this one in for it.
    monkeypatch.setattr("agl_bridge.tracing.rewards.trace.get_tracer", provider.get_tracer)
    with rollout_context("ro-r", "at-r"):
        emit_reward(0.5)
        provider.get_tracer("agent").start_span("agent.step").end()
    assert handle.force_flush(10_000)
    handle.shutdown()
    assert sorted(s.name for s in seen.get_finished_spans()) == ["agent.step", semconv.SPAN_REWARD]
    assert [(r.rollout_id, r.value) for r in capturing_sink.records] == [("ro-r", 0.5)]
    async with receiver.reader() as reader:
        assert await collect(reader.iter_all_rewards()) == []
        assert [s.name for s in await collect(reader.iter_all_spans())] == ["agent.step"]


def test_configuration_errors_are_explained() -> None:
    with pytest.raises(ValueError, match=semconv.ENV_ENDPOINT):
        configure_agent_tracing(provider=TracerProvider())
    with pytest.raises(ValueError, match="max_queue_size must be a positive integer"):
        configure_agent_tracing(endpoint="http://127.0.0.1:9", provider=TracerProvider(), max_queue_size=0)
    with pytest.raises(ValueError, match="cannot exceed max_queue_size"):
        configure_agent_tracing(
            endpoint="http://127.0.0.1:9", provider=TracerProvider(), max_queue_size=8, max_export_batch_size=16
        )
    with pytest.raises(TypeError, match="opentelemetry.sdk.trace.TracerProvider"):
        configure_agent_tracing(endpoint="http://127.0.0.1:9", provider=object())  # type: ignore[arg-type]
