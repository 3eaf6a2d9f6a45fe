"""Committing served calls to the store, each also mirrored as an OpenTelemetry span.

A call is written durably before its response is handed back, so a reward the agent emits after
reading the response always gets a later store sequence than the call. The OTel span carries the
same data for users who export traces elsewhere, following the GenAI semantic conventions (name
`chat {model}`, kind CLIENT, `gen_ai.*` attributes) plus our `agl.*` keys for what they lack
(docs/telemetry.md); its attributes are only built when a real tracer provider records it.

Every call carries what its request declared (`x-agl-call-class`, `x-agl-parent-call`): the class
as checked before sampling, the parent resolved to an earlier call's sequence (`parent_call`).
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from agl_bridge import semconv
from agl_bridge.proxy.parent_call import resolve_parent
from agl_bridge.proxy.request import (
    REQUEST_TOKENS,
    ChatRequest,
    ChatResult,
    RequestError,
    RolloutRoute,
    declared_class,
)
from agl_bridge.sampler.base import SampledSequence, SampleResult
from agl_bridge.store.base import Store
from agl_bridge.types import CallClass, LLMCall, Usage

logger = logging.getLogger(__name__)


class CallRecorder:
    """Writes `LLMCall` records for served requests into a store."""

    def __init__(self, store: Store, tracer: trace.Tracer | None = None) -> None:
        self.store = store
        self.tracer = tracer or trace.get_tracer(semconv.TRACER_NAME)

    async def record(
        self, request: ChatRequest, route: RolloutRoute, model: str, result: ChatResult, started: float
    ) -> list[int]:
        """Store one token-level call per choice of a chat request; return their sequences."""
        breaks = [_break_record(b) for b in result.prompt.prefix_breaks]
        return await self._record_choices(
            route,
            model,
            result.prompt_token_ids,
            [(c.sequence, c.message.text, c.message.finish_reason) for c in result.choices],
            messages=request.messages,
            prefix_breaks=breaks,
            carries=result.prompt.carries,
            started=started,
            request=request,
        )

    async def record_completion(
        self,
        route: RolloutRoute,
        *,
        model: str,
        prompt_token_ids: list[int],
        sampled: SampleResult,
        started: float,
        tokenizer: Any,
    ) -> list[int]:
        """Store one token-level call per sequence of a token-prompt completion (no messages)."""
        choices = [(s, tokenizer.decode(s.tokens, skip_special_tokens=False), s.stop_reason) for s in sampled.sequences]
        return await self._record_choices(
            route, model, prompt_token_ids, choices, messages=[], prefix_breaks=[], started=started
        )

    async def _record_choices(
        self,
        route: RolloutRoute,
        model: str,
        prompt_token_ids: list[int],
        choices: Sequence[tuple[SampledSequence, str, str]],
        *,
        messages: list[dict[str, Any]],
        prefix_breaks: list[dict[str, Any]],
        started: float,
        carries: list[int] | None = None,
        request: ChatRequest | None = None,
    ) -> list[int]:
        """Choices of one request share one store sequence (told apart by choice_index)."""
        ended = time.time()
        call_class, parent = declared_class(route), await resolve_parent(self.store, route)
        sequence = None
        if len(choices) > 1:
            sequence = await self.store.next_sequence(route.rollout_id, route.attempt_id)
        calls = [
            LLMCall(
                rollout_id=route.rollout_id,
                attempt_id=route.attempt_id,
                sequence=sequence,
                model=model,
                kind=semconv.CALL_KIND_TOKEN,
                prompt_token_ids=prompt_token_ids,
                response_token_ids=sampled.tokens,
                response_logprobs=sampled.logprobs,
                token_policy_versions=sampled.token_policy_versions,
                messages=messages,
                response_text=text,
                finish_reason=finish_reason,
                agent_name=route.agent_name,
                started_at=started,
                ended_at=ended,
                choice_index=index,
                prefix_breaks=prefix_breaks,
                usage=Usage(input_tokens=len(prompt_token_ids), output_tokens=len(sampled.tokens)),
                declared_class=call_class,
                declared_parent=parent,
                carries=list(carries or ()),
            )
            for index, (sampled, text, finish_reason) in enumerate(choices)
        ]
        sequences = await self._commit(calls, request)
        counted = REQUEST_TOKENS.get()
        if counted is not None:
            counted.prompt += len(prompt_token_ids)
            counted.completion += sum(len(sampled.tokens) for sampled, _, _ in choices)
        return sequences

    async def record_text_call(
        self,
        route: RolloutRoute,
        *,
        model: str,
        messages: Sequence[dict[str, Any]],
        response_text: str | None,
        finish_reason: str | None,
        started: float | None,
        ended: float | None,
        usage: Usage | None = None,
    ) -> int:
        """Store a call to a model that returns text only (kept for export, never trained on).

        Such a call was answered already (by another model, through LiteLLM): a class it declared that
        is not one of ours is left out with a warning instead of refusing anything.
        """
        call = LLMCall(
            rollout_id=route.rollout_id,
            attempt_id=route.attempt_id,
            model=model,
            kind=semconv.CALL_KIND_TEXT,
            messages=list(messages),
            response_text=response_text,
            finish_reason=finish_reason,
            agent_name=route.agent_name,
            started_at=started,
            ended_at=ended,
            usage=usage,
            declared_class=_declared_class_or_none(route),
            declared_parent=await resolve_parent(self.store, route),
        )
        return (await self._commit([call]))[0]

    async def _commit(self, calls: list[LLMCall], request: ChatRequest | None = None) -> list[int]:
        for call in calls:
            name = semconv.llm_call_span_name(_operation(call), call.model)
            span = self.tracer.start_span(name, kind=SpanKind.CLIENT, start_time=_ns(call.started_at))
            context = span.get_span_context()
            if context.is_valid:
                call.span_id, call.trace_id = f"{context.span_id:016x}", f"{context.trace_id:032x}"
            else:
                call.span_id, call.trace_id = secrets.token_hex(8), secrets.token_hex(16)
            if span.is_recording():
                span.set_attributes(span_attributes(call, request))
            span.end(end_time=_ns(call.ended_at))
        if len(calls) == 1:
            return [await self.store.add_llm_call(calls[0])]
        return await self.store.add_llm_calls(calls)


def span_attributes(call: LLMCall, request: ChatRequest | None = None) -> dict[str, Any]:
    """The OTel attributes of an LLM-call span: GenAI semantic conventions, plus agl.* for what they lack.

    `request` (the chat request the call answered) adds the convention's request attributes.
    """
    token_call = call.kind == semconv.CALL_KIND_TOKEN
    provider = semconv.GEN_AI_PROVIDER_AGL_BRIDGE if token_call else semconv.GEN_AI_PROVIDER_LITELLM
    attributes: dict[str, Any] = {
        semconv.GEN_AI_OPERATION_NAME: _operation(call),
        semconv.GEN_AI_PROVIDER_NAME: provider,
        semconv.GEN_AI_REQUEST_MODEL: call.model,
        semconv.GEN_AI_RESPONSE_MODEL: call.model,
        semconv.AGL_CALL_KIND: call.kind,
        semconv.AGL_CHOICE_INDEX: call.choice_index,
        semconv.AGL_REQUEST_MESSAGES: json.dumps(call.messages, ensure_ascii=False),
    }
    optional = {
        semconv.GEN_AI_CONVERSATION_ID: call.rollout_id,
        semconv.GEN_AI_AGENT_NAME: call.agent_name,
        **(_request_attributes(request) if request is not None else {}),
        semconv.GEN_AI_RESPONSE_FINISH_REASONS: [call.finish_reason] if call.finish_reason else None,
        semconv.GEN_AI_USAGE_INPUT_TOKENS: call.usage.input_tokens if call.usage else None,
        semconv.GEN_AI_USAGE_OUTPUT_TOKENS: call.usage.output_tokens if call.usage else None,
        semconv.AGL_ROLLOUT_ID: call.rollout_id,
        semconv.AGL_ATTEMPT_ID: call.attempt_id,
        semconv.AGL_RESPONSE_TEXT: call.response_text,
        semconv.AGL_PROMPT_TOKEN_IDS: call.prompt_token_ids or None,
        semconv.AGL_RESPONSE_TOKEN_IDS: call.response_token_ids or None,
        semconv.AGL_RESPONSE_LOGPROBS: call.response_logprobs or None,
        semconv.AGL_TOKEN_POLICY_VERSIONS: call.token_policy_versions or None,
        semconv.AGL_POLICY_VERSION: call.policy_version,
        semconv.AGL_PREFIX_BREAKS: json.dumps(call.prefix_breaks) if call.prefix_breaks else None,
        semconv.AGL_CALL_CLASS: None if call.declared_class is None else call.declared_class.value,
        semconv.AGL_CALL_PARENT: call.declared_parent,
        semconv.AGL_CALL_CARRIES: call.carries or None,
    }
    attributes.update({key: value for key, value in optional.items() if value is not None})
    return attributes


def _declared_class_or_none(route: RolloutRoute) -> CallClass | None:
    try:
        return declared_class(route)
    except RequestError as error:
        logger.warning("recording a text-only call without its declared class: %s", error.message)
        return None


def _request_attributes(request: ChatRequest) -> dict[str, Any]:
    """The convention's request attributes; None for those the request did not set."""
    params = request.params
    return {
        semconv.GEN_AI_REQUEST_MAX_TOKENS: params.max_tokens,
        semconv.GEN_AI_REQUEST_TEMPERATURE: float(params.temperature),
        semconv.GEN_AI_REQUEST_TOP_P: float(params.top_p),
        semconv.GEN_AI_REQUEST_TOP_K: params.top_k if params.top_k > 0 else None,
        semconv.GEN_AI_REQUEST_SEED: params.seed,
        semconv.GEN_AI_REQUEST_STOP_SEQUENCES: list(request.stop_strings) or None,
        semconv.GEN_AI_REQUEST_CHOICE_COUNT: request.n if request.n != 1 else None,
    }


def _operation(call: LLMCall) -> str:
    # Chat requests always have messages; a token-prompt /v1/completions call has none.
    if call.messages or call.kind != semconv.CALL_KIND_TOKEN:
        return semconv.GEN_AI_OPERATION_CHAT
    return semconv.GEN_AI_OPERATION_TEXT_COMPLETION


def _break_record(prefix_break: Any) -> dict[str, Any]:
    return {"message_index": prefix_break.message_index, "kind": prefix_break.kind, "reason": prefix_break.reason}


def _ns(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1e9)
