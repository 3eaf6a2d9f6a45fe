"""The front door: one gateway dispatches, sets affinity and checks the key once; a body is parsed once."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from proxy_helpers import MODEL, auth, stored_calls
from shared_helpers import new_id
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from agl_bridge.proxy.bridge_route import BridgeRoute
from agl_bridge.proxy.chat_route import ChatRoute
from agl_bridge.proxy.gateway import Gateway
from agl_bridge.sampler.affinity import current_affinity


class _App:
    """An ASGI app that answers 200 and remembers each request's path and affinity."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.seen.append((scope["path"], current_affinity()))
        await PlainTextResponse("litellm")(scope, receive, send)


def _own_route(seen: list[tuple[str, str | None]]) -> Route:
    async def handler(request: Request) -> PlainTextResponse:
        seen.append((request.url.path, current_affinity()))
        return PlainTextResponse("ours")

    return Route("/v1/completions", handler, methods=["POST"])


async def test_the_gateway_dispatches_our_routes_past_litellm_with_the_rollout_as_affinity() -> None:
    litellm, ours = _App(), []
    gateway = Gateway(litellm, api_key="sk-right", routes=[_own_route(ours)])
    key = {"Authorization": "Bearer sk-right"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway), base_url="http://front") as client:
        own = await client.post("/rollout/ro-1/attempt/at-1/v1/completions", json={}, headers=key)
        other = await client.post("/v1/chat/completions", json={}, headers={**key, "x-rollout-id": "ro-2"})
        wrong_method = await client.get("/v1/completions", headers=key)
        refused = await client.post("/v1/completions", json={}, headers={"Authorization": "Bearer sk-wrong"})
    assert (own.text, other.text) == ("ours", "litellm")
    assert ours == [("/v1/completions", "ro-1")]
    assert litellm.seen == [("/v1/chat/completions", "ro-2")]
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["code"] == "method_not_allowed"
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
    assert current_affinity() is None


class _Chat(ChatRoute):
    """A chat route serving model "tiny" that answers "direct" and remembers what it was handed."""

    def __init__(self) -> None:
        super().__init__({"tiny": Any}.get)  # type: ignore[arg-type]  # no real service: never called
        self.seen: list[tuple[Any, str | None, str | None]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any, *, service: Any, body: Any, route: Any) -> None:
        self.seen.append((body["model"], route.rollout_id, current_affinity()))
        await PlainTextResponse("direct")(scope, receive, send)


class _Bridges(BridgeRoute):
    """A bridge route that answers "bridged" and remembers the paths it was handed."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any, *, service: Any, body: Any, route: Any) -> None:
        self.seen.append(scope["path"])
        await PlainTextResponse("bridged")(scope, receive, send)


async def test_a_served_model_is_answered_at_the_front_door_and_everything_else_by_litellm() -> None:
    litellm, chat, bridges = _App(), _Chat(), _Bridges()
    gateway = Gateway(litellm, api_key="sk-right", chat=chat, bridges=bridges)
    key = {"Authorization": "Bearer sk-right"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway), base_url="http://front") as client:
        served = await client.post(
            "/rollout/ro-1/attempt/at-1/v1/chat/completions", json={"model": "tiny"}, headers=key
        )
        bare_path = await client.post("/chat/completions", json={"model": "tiny"}, headers=key)
        judge = await client.post("/v1/chat/completions", json={"model": "judge"}, headers=key)
        no_model = await client.post("/v1/chat/completions", json={"messages": []}, headers=key)
        broken = await client.post("/v1/chat/completions", content=b'{"model": "tiny",', headers=key)
        responses = await client.post("/v1/responses", json={"model": "tiny", "input": "hi"}, headers=key)
        messages = await client.post(
            "/v1/messages",
            json={"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]},
            headers=key,
        )
        judge_responses = await client.post("/v1/responses", json={"model": "judge", "input": "hi"}, headers=key)
    assert [r.text for r in (served, bare_path, responses, messages)] == ["direct", "direct", "bridged", "bridged"]
    assert chat.seen == [("tiny", "ro-1", "ro-1"), ("tiny", None, None)]
    assert bridges.seen == ["/v1/responses", "/v1/messages"]
    assert [r.text for r in (judge, no_model, broken, judge_responses)] == ["litellm"] * 4
    assert [path for path, _ in litellm.seen] == ["/v1/chat/completions"] * 3 + ["/v1/responses"]


async def test_a_body_over_the_limit_is_refused_with_413_declared_or_chunked() -> None:
    litellm, chat = _App(), _Chat()
    gateway = Gateway(litellm, api_key="sk-right", chat=chat, max_body_bytes=1000)
    key = {"Authorization": "Bearer sk-right"}

    async def chunks() -> Any:
        for _ in range(3):
            yield b"x" * 600

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway), base_url="http://front") as client:
        declared = await client.post("/v1/chat/completions", content=b"{" + b" " * 1000 + b"}", headers=key)
        chunked = await client.post("/v1/embeddings", content=chunks(), headers=key)
        at_limit = await client.post("/v1/chat/completions", json={"model": "tiny", "pad": "x" * 960}, headers=key)
    for refused in (declared, chunked):
        assert refused.status_code == 413
        error = refused.json()["error"]
        assert (error["param"], error["code"], error["type"]) == (
            "request_body",
            "request_too_large",
            "invalid_request_error",
        )
        assert "at most 1000 bytes" in error["message"] and "--max-request-mb" in error["message"]
    assert at_limit.text == "direct"
    assert litellm.seen == [] and len(chat.seen) == 1


def test_litellm_trusts_the_gateway_instead_of_checking_the_key_again(proxy_server: Any) -> None:
    from litellm.proxy import proxy_server as litellm_proxy

    from agl_bridge.proxy.litellm_hooks import admitted_by_gateway

    assert litellm_proxy.user_custom_auth is admitted_by_gateway
    rid = new_id("onekey")
    response = httpx.post(
        f"{proxy_server.base_url}/rollout/{rid}/attempt/a1/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers=auth(proxy_server),
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert len(stored_calls(proxy_server, rid)) == 1


async def test_litellm_refuses_a_request_that_did_not_pass_the_gateway() -> None:
    from litellm.proxy._types import LitellmUserRoles, ProxyException

    from agl_bridge.proxy.litellm_hooks import admitted_by_gateway

    bare = Request({"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []})
    with pytest.raises(ProxyException) as refused:
        await admitted_by_gateway(bare, "Bearer sk-anything")
    assert str(refused.value.code) == "401" and refused.value.openai_code == "invalid_api_key"
    admitted = Request({"type": "http", "path": "/v1/models", "headers": [], "state": {"agl.admitted": True}})
    identity = await admitted_by_gateway(admitted, "")
    assert identity.user_role == LitellmUserRoles.PROXY_ADMIN and "sk-" not in str(identity.api_key)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_chat_body_is_parsed_and_its_messages_normalised_once(
    proxy_server: Any, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    from agl_bridge.chat import codec, messages
    from agl_bridge.proxy import litellm_hooks, service

    calls = {"parse": 0, "normalize_messages": 0, "normalize_tools": 0}

    def counting(name: str, function: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return function(*args, **kwargs)

        return counted

    monkeypatch.setattr(service.ChatService, "parse_request", counting("parse", service.ChatService.parse_request))
    for module in (litellm_hooks, service, codec):
        monkeypatch.setattr(module, "normalize_messages", counting("normalize_messages", messages.normalize_messages))
        monkeypatch.setattr(module, "normalize_tools", counting("normalize_tools", messages.normalize_tools))
    tools = [{"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}}]
    response = httpx.post(
        f"{proxy_server.base_url}/rollout/{new_id('once')}/attempt/a1/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": tools,
            "max_tokens": 2,
            "stream": stream,
        },
        headers=auth(proxy_server),
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert calls == {"parse": 1, "normalize_messages": 1, "normalize_tools": 1}
