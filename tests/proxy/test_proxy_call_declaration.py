"""A call's declared class and parent (`x-agl-call-class`, `x-agl-parent-call`): read on every served route,
refused in each protocol's shape when the class is not one of ours, resolved to the parent's store sequence
when it names a call of the same attempt, kept as sent otherwise; recorded on the call and its span.

The front door runs in-process (the gateway, the chat and bridge routes, the token-id completions route) over a
scripted sampler and a real store; the LiteLLM provider is called as LiteLLM calls it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from litellm.types.utils import ModelResponse
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from shared_helpers import collect, new_id

from agl_bridge import semconv
from agl_bridge.chat import ChatCodec
from agl_bridge.proxy.chat_route import ChatRoute
from agl_bridge.proxy.completions import make_completions_router
from agl_bridge.proxy.gateway import Gateway
from agl_bridge.proxy.parent_call import MAX_UNRESOLVED_CHARS
from agl_bridge.proxy.provider import AglProvider
from agl_bridge.proxy.recording import CallRecorder
from agl_bridge.proxy.request import RolloutRoute, route_of
from agl_bridge.proxy.service import ChatService
from agl_bridge.sampler.instant import InstantSampler
from agl_bridge.store import SQLiteStore
from agl_bridge.types import CallClass, LLMCall

KEY = "sk-right"
MODEL = "tiny"
PATHS = {
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "anthropic": "/v1/messages",
    "completions": "/v1/completions",
}
BODIES: dict[str, dict[str, Any]] = {
    "chat": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
    "responses": {"input": "hi", "max_output_tokens": 8},
    "anthropic": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
    "completions": {"prompt": [1, 2, 3], "max_tokens": 8},
}


@dataclass
class Door:
    """The front door over one served model, its store and the spans its recorder wrote."""

    gateway: Gateway
    store: SQLiteStore
    service: ChatService
    spans: InMemorySpanExporter

    async def post(
        self, protocol: str, rollout: str, headers: dict[str, Any], *, stream: bool = False
    ) -> httpx.Response:
        """POST the protocol's small request under rollout attempt (`rollout`, "a1")."""
        body = {"model": MODEL, **BODIES[protocol], "stream": stream}
        transport = httpx.ASGITransport(app=self.gateway)
        async with httpx.AsyncClient(transport=transport, base_url="http://front") as client:
            return await client.post(
                f"/rollout/{rollout}/attempt/a1{PATHS[protocol]}",
                json=body,
                headers={"Authorization": f"Bearer {KEY}", **headers},
            )

    async def calls(self, rollout: str, attempt: str = "a1") -> list[LLMCall]:
        return await collect(self.store.iter_llm_calls(rollout, attempt))


@pytest.fixture
async def door(tiny_tokenizer: Any, tmp_path: Path) -> AsyncIterator[Door]:
    codec = ChatCodec(tiny_tokenizer)
    reply = tiny_tokenizer.encode("one two", add_special_tokens=False) + [codec.stop_token_ids[0]]
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    async with SQLiteStore(tmp_path / "store.sqlite") as store:
        service = ChatService(
            sampler=InstantSampler(reply, vocab_size=len(tiny_tokenizer)),
            codec=codec,
            recorder=CallRecorder(store, provider.get_tracer("test")),
            model_name=MODEL,
        )

        async def litellm(scope: Any, receive: Any, send: Any) -> None:
            raise AssertionError("the served model's requests must not reach LiteLLM")

        gateway = Gateway(
            litellm,
            api_key=KEY,
            chat=ChatRoute({MODEL: service}.get),
            routes=make_completions_router(lambda model: service).routes,
        )
        yield Door(gateway, store, service, spans)


def answer_id(protocol: str, response: httpx.Response) -> str | None:
    """The id the proxy answered with (None for token-id completions, whose ids name no recorded call)."""
    assert response.status_code == 200, response.text[:300]
    if protocol == "completions":
        return None
    if "text/event-stream" not in response.headers["content-type"]:
        return str(response.json()["id"])
    for line in response.text.splitlines():
        if line.startswith("data: {"):
            event = json.loads(line.removeprefix("data: "))
            found = event.get("id") or (event.get("response") or event.get("message") or {}).get("id")
            if found:
                return str(found)
    raise AssertionError(f"no id in the stream {response.text[:300]}")


CASES = [(protocol, stream) for protocol in PATHS for stream in (False, True)]


@pytest.mark.parametrize(("protocol", "stream"), CASES)
async def test_the_declared_class_and_parent_are_recorded_on_every_route(
    door: Door, protocol: str, stream: bool
) -> None:
    rollout = new_id(protocol)
    first = await door.post(protocol, rollout, {semconv.HEADER_CALL_CLASS: "main"}, stream=stream)
    parent = answer_id(protocol, first) or "0"  # completions: the parent named by its store sequence
    door.spans.clear()
    headers = {semconv.HEADER_CALL_CLASS: " Side ", semconv.HEADER_PARENT_CALL: parent}  # any case, spaces ignored
    answer_id(protocol, await door.post(protocol, rollout, headers, stream=stream))
    (main,), (side,) = [[c for c in await door.calls(rollout) if c.sequence == n] for n in (0, 1)]
    assert (main.declared_class, main.declared_parent) == (CallClass.MAIN, None)
    assert (side.declared_class, side.declared_parent) == (CallClass.SIDE, "0")  # the first call's sequence
    (span,) = door.spans.get_finished_spans()
    assert span.attributes is not None
    assert (span.attributes[semconv.AGL_CALL_CLASS], span.attributes[semconv.AGL_CALL_PARENT]) == ("side", "0")


async def test_nothing_declared_records_nothing_and_the_span_has_no_declaration(door: Door) -> None:
    rollout = new_id("plain")
    answer_id("chat", await door.post("chat", rollout, {}))
    (call,) = await door.calls(rollout)
    assert (call.declared_class, call.declared_parent) == (None, None)
    (span,) = door.spans.get_finished_spans()
    assert span.attributes is not None
    assert semconv.AGL_CALL_CLASS not in span.attributes and semconv.AGL_CALL_PARENT not in span.attributes


def _refusal_message(protocol: str, response: httpx.Response) -> str:
    """The refusal's message, checked to be in the protocol's own shape."""
    body = response.json()
    if protocol == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        return str(body["error"]["message"])
    assert body["error"]["param"] == semconv.HEADER_CALL_CLASS and body["error"]["code"] == "invalid_value"
    return str(body["error"]["message"])


@pytest.mark.parametrize(("protocol", "stream"), CASES)
async def test_a_class_that_is_not_ours_is_a_400_naming_the_header_and_nothing_is_sampled(
    door: Door, protocol: str, stream: bool
) -> None:
    rollout = new_id("bad")
    refused = await door.post(protocol, rollout, {semconv.HEADER_CALL_CLASS: "title"}, stream=stream)
    assert refused.status_code == 400, refused.text[:300]
    message = _refusal_message(protocol, refused)
    assert message.startswith(semconv.HEADER_CALL_CLASS) and "'title'" in message
    assert all(name in message for name in semconv.CALL_CLASSES)
    assert await door.calls(rollout) == []
    answer_id(protocol, await door.post(protocol, rollout, {semconv.HEADER_CALL_CLASS: "retry"}))  # still serving
    assert [c.declared_class for c in await door.calls(rollout)] == [CallClass.RETRY]


async def test_anthropic_token_counting_refuses_a_bad_class_too(door: Door) -> None:
    transport = httpx.ASGITransport(app=door.gateway)
    async with httpx.AsyncClient(transport=transport, base_url="http://front") as client:
        counted = await client.post(
            "/v1/messages/count_tokens",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            headers={"x-api-key": KEY, semconv.HEADER_CALL_CLASS: "nope"},
        )
    assert counted.status_code == 400 and semconv.HEADER_CALL_CLASS in counted.json()["error"]["message"]


async def test_a_parent_that_names_no_call_of_the_attempt_is_kept_as_sent(door: Door) -> None:
    rollout, other = new_id("kept"), new_id("other")
    elsewhere = answer_id("chat", await door.post("chat", other, {}))  # a call of another rollout
    assert elsewhere is not None and elsewhere.startswith("chatcmpl-agl-")
    garbage = "résumé-" + "x" * 400
    unknown_id = elsewhere[:-4] + "AAAA"  # an id of ours naming no recorded call
    sent = [elsewhere, "resp_not-ours", "msg_%%", garbage, unknown_id, "007"]
    for parent in sent:  # sent as latin-1 bytes, as HTTP carries them
        answer_id("chat", await door.post("chat", rollout, {semconv.HEADER_PARENT_CALL: parent.encode("latin-1")}))
    recorded = [c.declared_parent for c in await door.calls(rollout)]
    assert recorded == [elsewhere, "resp_not-ours", "msg_%%", garbage[:MAX_UNRESOLVED_CHARS], unknown_id[:200], "7"]
    assert len(recorded[3] or "") == MAX_UNRESOLVED_CHARS


async def test_a_parent_of_another_attempt_of_the_same_rollout_is_not_resolved(door: Door) -> None:
    rollout = new_id("attempts")
    transport = httpx.ASGITransport(app=door.gateway)
    async with httpx.AsyncClient(transport=transport, base_url="http://front") as client:
        earlier = await client.post(
            f"/rollout/{rollout}/attempt/a0/v1/chat/completions",
            json={"model": MODEL, **BODIES["chat"]},
            headers={"Authorization": f"Bearer {KEY}"},
        )
    parent = answer_id("chat", earlier)
    assert parent is not None
    answer_id("chat", await door.post("chat", rollout, {semconv.HEADER_PARENT_CALL: parent}))
    (call,) = await door.calls(rollout)
    assert call.declared_parent == parent


async def test_the_responses_and_anthropic_ids_resolve_across_protocols(door: Door) -> None:
    rollout = new_id("across")
    ids = [answer_id(p, await door.post(p, rollout, {})) for p in ("responses", "anthropic", "chat")]
    assert [i[:5] for i in ids if i] == ["resp_", "msg_a", "chatc"]
    for parent in ids:
        assert parent is not None
        answer_id("chat", await door.post("chat", rollout, {semconv.HEADER_PARENT_CALL: parent}))
    assert [c.declared_parent for c in await door.calls(rollout)][3:] == ["0", "1", "2"]


# ---------------------------------------------------------------------------------- LiteLLM's provider path


def _litellm_params(rollout: str, headers: dict[str, str]) -> dict[str, Any]:
    """`litellm_params` as LiteLLM's proxy hands them on: the request headers kept in the metadata."""
    return {"metadata": {"headers": {semconv.HEADER_ROLLOUT_ID: rollout, semconv.HEADER_ATTEMPT_ID: "a1", **headers}}}


def test_the_route_of_a_litellm_call_carries_the_declaration() -> None:
    headers = {semconv.HEADER_CALL_CLASS: "subagent", semconv.HEADER_PARENT_CALL: "3"}
    route = route_of(_litellm_params("ro", headers))
    assert route == RolloutRoute("ro", "a1", None, "subagent", "3")
    proxied = route_of({"proxy_server_request": {"headers": {semconv.HEADER_CALL_CLASS: "x"}}})
    assert proxied.call_class == "x"


@pytest.mark.parametrize("stream", [False, True])
async def test_the_litellm_provider_records_the_declaration_and_refuses_a_bad_class(door: Door, stream: bool) -> None:
    provider = AglProvider()
    provider.register(door.service)
    rollout = new_id("provider")

    async def complete(headers: dict[str, str]) -> str:
        arguments: dict[str, Any] = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "api_base": None,
            "custom_prompt_dict": {},
            "model_response": ModelResponse(),
            "print_verbose": print,
            "encoding": None,
            "api_key": None,
            "logging_obj": None,
            "optional_params": {"max_tokens": 8},
            "litellm_params": _litellm_params(rollout, headers),
        }
        if not stream:
            return str((await provider.acompletion(**arguments)).id)
        chunks = [chunk async for chunk in provider.astreaming(**arguments)]
        return str(chunks[0].id)

    first = await complete({semconv.HEADER_CALL_CLASS: "compaction"})
    await complete({semconv.HEADER_CALL_CLASS: "MAIN", semconv.HEADER_PARENT_CALL: first})
    with pytest.raises(Exception) as refused:
        await complete({semconv.HEADER_CALL_CLASS: "summary"})
    assert getattr(refused.value, "status_code", None) == 400 and semconv.HEADER_CALL_CLASS in str(refused.value)
    assert [(c.declared_class, c.declared_parent) for c in await door.calls(rollout)] == [
        (CallClass.COMPACTION, None),
        (CallClass.MAIN, "0"),
    ]


async def test_a_text_only_call_with_a_class_not_ours_is_recorded_without_it(
    door: Door, caplog: pytest.LogCaptureFixture
) -> None:
    route = RolloutRoute(new_id("text"), "a1", None, "judge", "0")
    await door.service.recorder.record_text_call(
        route, model="judge-model", messages=[], response_text="ok", finish_reason="stop", started=None, ended=None
    )
    (call,) = await door.calls(route.rollout_id or "")
    assert (call.kind, call.declared_class, call.declared_parent) == ("text", None, "0")
    assert "declared class" in caplog.text and "'judge'" in caplog.text
