"""The hostile agent: a process holding an agent key for one attempt tries everything else, and is refused.

The agent gets what the runner or a harness gives it — an agent key scoped to rollout A, attempt
`at-0` — and tries to grade itself, finish or start attempts, mint itself keys, load weights, read
another rollout's stored responses, reach LiteLLM's management routes, spoof routing headers, walk
out of its prefix with `..` and encoded slashes, open websockets, and smuggle rewards or another
rollout's spans through the OTLP receiver. Each attempt must be refused (401/403/404) in the
protocol's error shape, leave the store as it was, and be logged with the key's scope (never the key).
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from shared_helpers import new_id

from agl_bridge.agent_keys import AgentKeys, KeyRefusal
from agl_bridge.proxy.access_log import ACCESS_LOGGER
from agl_bridge.proxy.adapters import confined
from agl_bridge.proxy.gateway import Gateway
from agl_bridge.proxy.request import RequestError
from agl_bridge.testing.checks import error_problem

MANAGEMENT = [
    ("GET", "/routes"),
    ("GET", "/model/info"),
    ("GET", "/v1/model/info"),
    ("GET", "/config/yaml"),
    ("GET", "/get/config/callbacks"),
    ("GET", "/debug/asyncio-tasks"),
    ("GET", "/sso/key/generate"),
    ("GET", "/health"),
    ("POST", "/key/generate"),
    ("POST", "/user/new"),
    ("POST", "/team/new"),
    ("POST", "/model/new"),
    ("GET", "/spend/logs"),
    ("GET", "/global/spend"),
]


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def access_lines() -> Iterator[list[str]]:
    handler = _Lines()
    level = ACCESS_LOGGER.level
    ACCESS_LOGGER.addHandler(handler)
    ACCESS_LOGGER.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        ACCESS_LOGGER.removeHandler(handler)
        ACCESS_LOGGER.setLevel(level)


def _operator(server: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.api_key}"}


def _raw(port: int, method: str, target: str, key: str, body: bytes = b"{}") -> tuple[int, bytes]:
    """One HTTP/1.1 request with `target` sent byte for byte (no client normalises its `..` or `%2F`)."""
    request = (
        f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(request)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), payload


def _otlp_span(rollout: str, attempt: str, *, reward: bool) -> dict[str, Any]:
    attributes = [
        {"key": "agl.rollout_id", "value": {"stringValue": rollout}},
        {"key": "agl.attempt_id", "value": {"stringValue": attempt}},
    ]
    if reward:
        attributes.append({"key": "agl.reward.value", "value": {"doubleValue": 1.0}})
    span = {
        "traceId": "0af7651916cd43dd8448eb211c80319c",
        "spanId": f"{abs(hash((rollout, reward))) % (1 << 63):016x}",
        "name": "agl.reward" if reward else "tool.run",
        "kind": 1,
        "startTimeUnixNano": str(time.time_ns()),
        "endTimeUnixNano": str(time.time_ns()),
        "attributes": attributes,
    }
    return {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}


def _state(server: Any, rollout: str) -> tuple[Any, list[Any], list[Any]]:
    """(rollout record, rewards, spans) the store holds for `rollout`."""

    async def read() -> tuple[Any, list[Any], list[Any]]:
        store = server.store
        record = await store.get_rollout(rollout)
        rewards = [r async for r in store.iter_rewards(rollout)]
        spans = [s async for s in store.iter_spans(rollout)]
        return record, rewards, spans

    return server.run_coroutine(read())


def test_an_agent_key_reaches_its_model_and_nothing_else(proxy_server: Any, access_lines: list[str]) -> None:
    base = proxy_server.base_url
    a, b = new_id("ro-agent-a"), new_id("ro-agent-b")
    with httpx.Client(base_url=base, timeout=60) as client:
        started = client.post(
            f"/rollout/{a}/attempt/at-0/start", json={"task_id": "t"}, headers=_operator(proxy_server)
        )
        assert started.status_code == 200, started.text
        key = started.json()["agent_key"]
        assert key.startswith("agl-agent-") and a not in key  # nothing readable in it
        other = client.post(f"/rollout/{b}/attempt/at-0/agent_key", json={}, headers=_operator(proxy_server))
        key_b = other.json()["agent_key"]
        agent = {"Authorization": f"Bearer {key}"}

        # What the agent may do: call its own model, read its own stored response, send its own spans.
        mine = client.post(
            f"/rollout/{a}/attempt/at-0/v1/responses",
            json={"model": "tiny", "input": "hi", "max_output_tokens": 4},
            headers=agent,
        )
        assert mine.status_code == 200, mine.text
        chat = client.post(
            "/v1/chat/completions",  # no prefix: an agent key routes itself to its attempt
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            headers={**agent, "x-agl-call-class": "main"},  # the call-graph headers are an agent's to send
        )
        assert chat.status_code == 200, chat.text
        assert (
            client.get(f"/rollout/{a}/attempt/at-0/v1/responses/{mine.json()['id']}", headers=agent).status_code == 200
        )
        assert client.get(f"/rollout/{a}/attempt/at-0/v1/models", headers=agent).status_code == 200
        own_span = client.post(
            f"/rollout/{a}/attempt/at-0/v1/traces", json=_otlp_span(a, "at-0", reward=False), headers=agent
        )
        assert own_span.status_code == 200, own_span.text

        theirs = client.post(
            f"/rollout/{b}/attempt/at-0/v1/responses",
            json={"model": "tiny", "input": "hi", "max_output_tokens": 4},
            headers={"Authorization": f"Bearer {key_b}"},
        )
        assert theirs.status_code == 200, theirs.text
        their_id = theirs.json()["id"]
        before_a, before_b = _state(proxy_server, a), _state(proxy_server, b)

        prefix = f"/rollout/{a}/attempt/at-0"
        attacks: list[tuple[str, str, str, dict[str, str], Any]] = [
            ("grade itself", "POST", f"{prefix}/reward", agent, {"value": 1.0}),
            ("finish itself", "POST", f"{prefix}/finish", agent, {"status": "succeeded"}),
            ("start itself", "POST", f"{prefix}/start", agent, {}),
            ("mint itself a key", "POST", f"{prefix}/agent_key", agent, {}),
            ("grade another rollout", "POST", f"/rollout/{b}/attempt/at-0/reward", agent, {"value": 1.0}),
            ("finish another rollout", "POST", f"/rollout/{b}/attempt/at-0/finish", agent, {"status": "failed"}),
            ("grade by header", "POST", "/reward", {**agent, "x-rollout-id": a, "x-attempt-id": "at-0"}, {"value": 1}),
            (
                "load weights",
                "POST",
                f"{prefix}/v1/load_lora_adapter",
                agent,
                {"lora_name": "evil", "lora_path": "/tmp"},
            ),
            ("unload weights", "POST", "/v1/unload_lora_adapter", agent, {"lora_name": "tiny"}),
            ("read another rollout's response", "GET", f"{prefix}/v1/responses/{their_id}", agent, None),
            (
                "continue another rollout's response",
                "POST",
                f"{prefix}/v1/responses",
                agent,
                {"model": "tiny", "input": "go on", "previous_response_id": their_id, "max_output_tokens": 4},
            ),
            ("delete its own response", "DELETE", f"{prefix}/v1/responses/{mine.json()['id']}", agent, None),
            ("another rollout's model route", "POST", f"/rollout/{b}/attempt/at-0/v1/chat/completions", agent, {}),
            ("another attempt's model route", "POST", f"/rollout/{a}/attempt/at-1/v1/chat/completions", agent, {}),
            ("spoof x-rollout-id", "POST", "/v1/chat/completions", {**agent, "x-rollout-id": b}, {}),
            ("spoof x-attempt-id", "POST", "/v1/chat/completions", {**agent, "x-attempt-id": "at-9"}, {}),
            ("embeddings", "POST", f"{prefix}/v1/embeddings", agent, {"model": "tiny", "input": "x"}),
            ("OTLP span of another rollout", "POST", f"{prefix}/v1/traces", agent, _otlp_span(b, "at-0", reward=False)),
            ("OTLP reward of its own", "POST", f"{prefix}/v1/traces", agent, _otlp_span(a, "at-0", reward=True)),
            ("tampered key", "POST", f"{prefix}/v1/chat/completions", {"Authorization": f"Bearer {key[:-2]}AA"}, {}),
            (
                "key of another server",
                "POST",
                f"{prefix}/v1/chat/completions",
                {"Authorization": f"Bearer {AgentKeys('sk-elsewhere').mint(a, 'at-0')}"},
                {},
            ),
            ("two attempts' keys", "POST", f"{prefix}/v1/chat/completions", {**agent, "x-api-key": key_b}, {}),
            ("key in the query string", "POST", f"{prefix}/v1/chat/completions?api_key={key}", {}, {}),
            ("no key", "POST", f"{prefix}/v1/chat/completions", {}, {}),
        ]
        attacks += [(f"LiteLLM {path}", method, prefix + path, agent, {}) for method, path in MANAGEMENT]
        attacks += [(f"LiteLLM {path} unprefixed", method, path, agent, {}) for method, path in MANAGEMENT]

        refused: list[str] = []
        for label, method, path, headers, body in attacks:
            kwargs: dict[str, Any] = {} if body is None else {"json": body}
            response = client.request(method, path, headers=headers, **kwargs)
            assert response.status_code in (401, 403, 404), f"{label}: {response.status_code} {response.text[:300]}"
            assert error_problem(path, response) is None, f"{label}: {error_problem(path, response)}"
            assert key not in response.text and proxy_server.api_key not in response.text, label
            refused.append(label)

    # Paths no HTTP client would send as written: `..` out of the prefix, encoded slashes.
    raw = [
        f"/rollout/{a}/attempt/at-0/../../{b}/attempt/at-0/reward",
        f"/rollout/{a}/attempt/at-0/v1/../reward",
        f"/rollout/{a}%2F..%2F{b}/attempt/at-0/reward",
        f"/rollout/{a}/attempt/at-0%2F..%2F..%2F{b}%2Fattempt%2Fat-0/v1/chat/completions",
        f"/rollout/{a}/attempt/at-0/v1/models/..%2F..%2Fconfig%2Fyaml",
        f"/rollout/{a}/attempt/at-0//v1/load_lora_adapter",
    ]
    for target in raw:
        status, payload = _raw(proxy_server.port, "POST", target, key, json.dumps({"value": 1.0}).encode())
        assert status in (401, 403, 404), f"{target}: {status} {payload[:300]!r}"
        assert "error" in json.loads(payload), target
        refused.append(target)

    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    ws_base = base.replace("http://", "ws://")
    for path in ("/v1/realtime?model=tiny", f"/rollout/{a}/attempt/at-0/v1/realtime?model=tiny"):
        with pytest.raises(InvalidStatus) as excinfo:
            connect(ws_base + path, additional_headers={"Authorization": f"Bearer {key}"}, open_timeout=30)
        assert excinfo.value.response.status_code == 403
        refused.append(f"websocket {path}")

    assert _state(proxy_server, a) == before_a  # no reward, no span, still running
    assert _state(proxy_server, b) == before_b
    assert before_a[0].status.value == "running" and before_a[1] == []
    assert len(refused) == len(attacks) + len(raw) + 2
    # Every refusal is logged with the key's scope, never the key.
    agent_lines = [line for line in access_lines if f"key=agent:{a}/at-0" in line]
    assert len(agent_lines) >= len(
        [x for x in attacks if x[3] is agent or x[3].get("Authorization") == agent["Authorization"]]
    )
    assert any("key=refused" in line for line in access_lines) and any("key=none" in line for line in access_lines)
    assert not any(key in line or proxy_server.api_key in line for line in access_lines)


def test_the_operator_keeps_every_capability(proxy_server: Any) -> None:
    a = new_id("ro-operator")
    operator = _operator(proxy_server)
    with httpx.Client(base_url=proxy_server.base_url, timeout=60) as client:
        made = client.post(
            f"/rollout/{a}/attempt/at-0/v1/responses",
            json={"model": "tiny", "input": "hi", "max_output_tokens": 4},
            headers=operator,
        )
        assert made.status_code == 200, made.text
        assert client.get(f"/v1/responses/{made.json()['id']}", headers=operator).status_code == 200  # any rollout's
        elsewhere = client.get(f"/rollout/ro-other/attempt/at-0/v1/responses/{made.json()['id']}", headers=operator)
        assert elsewhere.status_code == 404  # but a record resolves only within its own rollout
        reward = client.post(f"/rollout/{a}/attempt/at-0/reward", json={"value": 0.5}, headers=operator)
        assert reward.status_code == 200, reward.text
        finish = client.post(f"/rollout/{a}/attempt/at-0/finish", json={"status": "succeeded"}, headers=operator)
        assert finish.status_code == 200, finish.text
        closed = client.get("/config/yaml", headers=operator)
        assert closed.status_code == 404 and "--litellm-admin-routes" in closed.json()["error"]["message"]


def test_expired_keys_are_refused_without_saying_which_part_was_right(proxy_server: Any) -> None:
    a = new_id("ro-expiry")
    key = proxy_server.agent_key(a, "at-0", ttl_s=0.001)  # valid until the next whole second after the next
    time.sleep(2.1)
    response = httpx.post(
        f"{proxy_server.base_url}/rollout/{a}/attempt/at-0/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert response.status_code == 401 and "expired" in response.json()["error"]["message"]
    keys = AgentKeys(proxy_server.api_key)
    fresh = keys.mint(a, "at-0")
    body, _, signature = fresh.rpartition(".")
    tampered_body = keys.check(body[:-1] + ("A" if body[-1] != "A" else "B") + "." + signature)
    tampered_signature = keys.check(body + "." + signature[:-1] + ("A" if signature[-1] != "A" else "B"))
    assert tampered_body == tampered_signature  # one answer, whichever part was altered
    for last in "ABCD":  # the signature's last character carries base64 padding bits: one spelling is valid
        spelled = body + "." + signature[:-1] + last
        assert isinstance(keys.check(spelled), KeyRefusal) == (spelled != fresh)


async def test_management_routes_open_to_the_operator_only_when_asked() -> None:
    seen: list[str] = []

    async def litellm(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    operator = {"Authorization": "Bearer sk-op"}
    agent = {"Authorization": f"Bearer {AgentKeys('sk-op').mint('ro-1', 'at-0')}"}
    for opened in (False, True):
        gateway = Gateway(litellm, api_key="sk-op", management_routes=opened)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway), base_url="http://proxy") as client:
            assert (await client.get("/config/yaml", headers=operator)).status_code == (200 if opened else 404)
            assert (await client.get("/config/yaml", headers=agent)).status_code == 404  # never for an agent
            assert (await client.post("/v1/embeddings", json={}, headers=operator)).status_code == 200
    assert seen == ["/v1/embeddings", "/config/yaml", "/v1/embeddings"]


def test_adapters_load_only_from_inside_the_adapter_directory(tmp_path: Path) -> None:
    root = tmp_path / "adapters"
    (root / "step-1").mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    assert confined(root, "step-1") == str((root / "step-1").resolve())
    assert confined(root, str(root / "step-1")) == str((root / "step-1").resolve())
    for given in (str(outside), "../elsewhere", "step-1/../../elsewhere", "escape", str(root / "escape"), "/etc"):
        with pytest.raises(RequestError) as excinfo:
            confined(root, given)
        assert excinfo.value.status == 403 and excinfo.value.param == "lora_path", given
    assert confined(None, "/any/path") == "/any/path"  # without a directory the operator names any path
