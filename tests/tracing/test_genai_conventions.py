"""Our spans follow the OpenTelemetry GenAI semantic conventions, checked on what the SDK's own exporters see.

A chat call served by the proxy's `ChatService` over the tiny model is exported through the SDK's
`InMemorySpanExporter` and, at the same time, through its OTLP/HTTP exporter into our receiver; a
reward goes through the same two exporters. Every attribute documented in docs/telemetry.md is
checked, and the page is checked to list every key `semconv` defines.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from shared_helpers import collect
from tracing_helpers import ReceiverServer

from agl_bridge import emit_reward, semconv
from agl_bridge.tracing import rollout_context, set_reward_sink

DOCS = Path(__file__).resolve().parents[2] / "docs" / "telemetry.md"


class SpanKeepingSink:
    """A reward sink that keeps the finished reward spans it is handed."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def deliver(self, spans: Any) -> None:
        self.spans.extend(spans)

    async def deliver_async(self, spans: Any) -> None:
        self.deliver(spans)


@pytest.fixture
def exporters(receiver: ReceiverServer) -> tuple[TracerProvider, InMemorySpanExporter]:
    """A tracer provider exporting through the SDK's in-memory exporter and its OTLP/HTTP one into `receiver`."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=receiver.url + semconv.OTLP_TRACES_PATH)))
    return provider, memory


async def test_chat_call_spans_follow_the_genai_conventions(
    exporters: tuple[TracerProvider, InMemorySpanExporter], receiver: ReceiverServer, tiny_model_dir: Path, store: Any
) -> None:
    from agl_bridge.chat import ChatCodec
    from agl_bridge.models.loading import load_causal_lm, load_tokenizer
    from agl_bridge.proxy.recording import CallRecorder
    from agl_bridge.proxy.service import ChatService, RolloutRoute
    from agl_bridge.sampler.hf import HFSampler

    provider, memory = exporters
    tokenizer = load_tokenizer(tiny_model_dir)
    with HFSampler(load_causal_lm(tiny_model_dir), tokenizer, seed=0) as sampler:
        service = ChatService(
            sampler=sampler,
            codec=ChatCodec(tokenizer),
            recorder=CallRecorder(store, provider.get_tracer(semconv.TRACER_NAME)),
            model_name="tiny",
        )
        body = {
            "messages": [{"role": "user", "content": "Say you are 7."}],
            "max_tokens": 6,
            "n": 2,
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 40,
            "seed": 3,
            "stop": ["zzz"],
        }
        await service.complete(service.parse_request(body), RolloutRoute("ro-gen", "at-1", "player"))
    calls = await collect(store.iter_llm_calls("ro-gen"))
    spans = sorted(memory.get_finished_spans(), key=lambda s: s.attributes[semconv.AGL_CHOICE_INDEX])
    assert len(spans) == len(calls) == 2
    for span, call in zip(spans, calls, strict=True):
        assert span.name == "chat tiny"
        assert span.kind is SpanKind.CLIENT
        assert f"{span.context.span_id:016x}" == call.span_id
        attributes = dict(span.attributes or {})
        assert attributes == {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "agl_bridge",
            "gen_ai.request.model": "tiny",
            "gen_ai.response.model": "tiny",
            "gen_ai.conversation.id": "ro-gen",
            "gen_ai.agent.name": "player",
            "gen_ai.request.max_tokens": 6,
            "gen_ai.request.temperature": 0.7,
            "gen_ai.request.top_p": 0.9,
            "gen_ai.request.top_k": 40,
            "gen_ai.request.seed": 3,
            "gen_ai.request.stop_sequences": ("zzz",),
            "gen_ai.request.choice.count": 2,
            "gen_ai.response.finish_reasons": (call.finish_reason,),
            "gen_ai.usage.input_tokens": len(call.prompt_token_ids),
            "gen_ai.usage.output_tokens": len(call.response_token_ids),
            "agl.call.kind": "token",
            "agl.choice_index": call.choice_index,
            "agl.request.messages": json.dumps(call.messages, ensure_ascii=False),
            "agl.rollout_id": "ro-gen",
            "agl.attempt_id": "at-1",
            "agl.response.text": call.response_text,
            "agl.prompt_token_ids": tuple(call.prompt_token_ids),
            "agl.response_token_ids": tuple(call.response_token_ids),
            "agl.response_logprobs": tuple(call.response_logprobs),
            "agl.token_policy_versions": tuple(call.token_policy_versions),
            "agl.policy_version": 0,
        }

    # The OTLP exporter delivered the same spans, attributes intact, into our receiver.
    async with receiver.reader() as reader:
        received = sorted(await collect(reader.iter_spans("ro-gen")), key=lambda s: s.attributes["agl.choice_index"])
    assert [(s.name, s.kind, s.span_id) for s in received] == [("chat tiny", "client", c.span_id) for c in calls]
    for stored, span in zip(received, spans, strict=True):
        expected = {k: list(v) if isinstance(v, tuple) else v for k, v in (span.attributes or {}).items()}
        assert stored.attributes == expected


async def test_reward_spans_carry_the_genai_evaluation_attributes(receiver: ReceiverServer) -> None:
    memory = InMemorySpanExporter()
    sink = SpanKeepingSink()
    previous = set_reward_sink(sink)
    try:
        with rollout_context("ro-eval", "at-1"):
            emit_reward(0.75, name="accuracy")
    finally:
        set_reward_sink(previous)
    (span,) = sink.spans
    assert span.name == semconv.SPAN_REWARD
    assert dict(span.attributes or {}) == {
        "gen_ai.evaluation.name": "accuracy",
        "gen_ai.evaluation.score.value": 0.75,
        "gen_ai.conversation.id": "ro-eval",
        "agl.reward.name": "accuracy",
        "agl.reward.value": 0.75,
        "agl.rollout_id": "ro-eval",
        "agl.attempt_id": "at-1",
    }
    memory.export([span])
    OTLPSpanExporter(endpoint=receiver.url + semconv.OTLP_TRACES_PATH).export([span])
    assert [s.name for s in memory.get_finished_spans()] == [semconv.SPAN_REWARD]
    async with receiver.reader() as reader:
        (reward,) = await collect(reader.iter_rewards("ro-eval"))
    assert (reward.name, reward.value, reward.attempt_id) == ("accuracy", 0.75, "at-1")


def test_the_telemetry_page_lists_every_attribute_we_write() -> None:
    page = DOCS.read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `((?:gen_ai|agl)\.[a-z_.]+)`", page, re.MULTILINE))
    keys = {
        value
        for name, value in vars(semconv).items()
        if name.startswith(("GEN_AI_", "AGL_")) and isinstance(value, str) and "." in value
    }
    assert keys <= documented, f"undocumented: {sorted(keys - documented)}"
    assert documented <= keys, f"documented but never defined: {sorted(documented - keys)}"


def test_text_only_and_token_prompt_calls_name_their_provider_and_operation() -> None:
    from agl_bridge.proxy.recording import span_attributes
    from agl_bridge.types import LLMCall

    text = span_attributes(
        LLMCall(model="judge", kind="text", messages=[{"role": "user", "content": "hi"}], response_text="ok")
    )
    assert (text["gen_ai.operation.name"], text["gen_ai.provider.name"]) == ("chat", "litellm")
    assert not any(key.endswith("token_ids") for key in text)
    completion = span_attributes(
        LLMCall(model="tiny", prompt_token_ids=[1, 2], response_token_ids=[3], response_logprobs=[-0.5])
    )
    assert (completion["gen_ai.operation.name"], completion["gen_ai.provider.name"]) == (
        "text_completion",
        "agl_bridge",
    )
    assert semconv.llm_call_span_name(completion["gen_ai.operation.name"], "tiny") == "text_completion tiny"
