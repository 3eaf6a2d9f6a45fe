"""Bad requests get an OpenAI-style error naming the field, and a flood of them leaves the proxy serving.

Every refusal: a 4xx status and the body `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import httpx
import openai
import pytest
from proxy_helpers import MODEL, stored_calls
from shared_helpers import new_id

GOOD = [{"role": "user", "content": "hi"}]
# The proxy promises each request an answer, not a latency: on a loaded machine an answer can take longer than
# httpx's default 5 s, so calls that test what the answer is wait for it.
NO_DEADLINE = httpx.Timeout(None)


def _chat(**fields: Any) -> bytes:
    return json.dumps({"model": MODEL, "messages": GOOD, "max_tokens": 2, **fields}).encode()


# (id, body bytes, expected status, expected param)
BAD_BODIES: list[tuple[str, bytes, int, str | None]] = [
    ("malformed-json", b'{"model": "tiny", "messages": [', 400, "request_body"),
    ("not-json", b"hello", 400, "request_body"),
    ("json-list", b"[1, 2]", 400, "request_body"),
    ("json-null", b"null", 400, "request_body"),
    ("json-string", b'"hi"', 400, "request_body"),
    ("missing-messages", json.dumps({"model": MODEL}).encode(), 400, "messages"),
    ("empty-messages", _chat(messages=[]), 400, "messages"),
    ("messages-not-a-list", _chat(messages="hi"), 400, "messages"),
    ("message-not-an-object", _chat(messages=[5]), 400, "messages[0]"),
    ("unknown-role", _chat(messages=[{"role": "wizard", "content": "x"}]), 400, "messages[0].role"),
    ("content-int", _chat(messages=[{"role": "user", "content": 5}]), 400, "messages[0].content"),
    (
        "content-part-int",
        _chat(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]),
        400,
        "messages[0].content[0].text",
    ),
    ("content-missing", _chat(messages=[{"role": "user"}]), 400, "messages[0].content"),
    ("unknown-model", _chat(model="gpt-nope"), 404, "model"),
    ("model-not-a-string", _chat(model=5), 400, "model"),
    ("context-overflow", _chat(messages=[{"role": "user", "content": "lorem ipsum " * 30000}]), 400, "messages"),
    ("max-tokens-zero", _chat(max_tokens=0), 400, "max_tokens"),
    ("max-tokens-negative", _chat(max_tokens=-5), 400, "max_tokens"),
    ("max-tokens-string", _chat(max_tokens="5"), 400, "max_tokens"),
    ("n-zero", _chat(n=0), 400, "n"),
    ("n-beyond-the-batch", _chat(n=10_000), 400, "n"),
    ("top-logprobs-too-many", _chat(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    ("seed-not-an-int", _chat(seed="abc"), 400, "seed"),
    ("temperature-string", _chat(temperature="hot"), 400, "temperature"),
    ("top-logprobs-without-logprobs", _chat(top_logprobs=2), 400, "top_logprobs"),
    ("stop-not-strings", _chat(stop=[1, 2]), 400, "stop"),
    ("tools-not-a-list", _chat(tools="x"), 400, "tools"),
    ("tool-without-function", _chat(tools=[{"type": "function"}]), 400, "tools[0].function"),
    ("tool-choice-unknown", _chat(tool_choice="sometimes"), 400, "tool_choice"),
]


def _check_error(response: httpx.Response, status: int, param: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert {"message", "type", "param", "code"} <= set(error), error
    assert isinstance(error["message"], str) and error["message"]
    assert "Traceback" not in error["message"]
    assert error["param"] == param, error
    return error


def _headers(server: Any, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.api_key}", "content-type": "application/json", **extra}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(("body", "status", "param"), [b[1:] for b in BAD_BODIES], ids=[b[0] for b in BAD_BODIES])
def test_bad_chat_request_is_an_openai_error_naming_the_field(
    proxy_server: Any, body: bytes, status: int, param: str | None, stream: bool
) -> None:
    if stream and body.startswith(b"{") and body.endswith(b"}"):
        body = body[:-1] + b', "stream": true}'
    response = httpx.post(
        f"{proxy_server.base_url}/v1/chat/completions", content=body, headers=_headers(proxy_server), timeout=60
    )
    error = _check_error(response, status, param)
    # LiteLLM's own check of a non-string model says "bad_request_error"; everything else is OpenAI's type.
    assert error["type"] == ("bad_request_error" if param == "model" and status == 400 else "invalid_request_error")


def test_the_openai_client_raises_the_matching_exceptions(proxy_server: Any) -> None:
    with openai.OpenAI(base_url=proxy_server.openai_base_url(), api_key=proxy_server.api_key, max_retries=0) as client:
        with pytest.raises(openai.NotFoundError) as missing:
            client.chat.completions.create(model="gpt-nope", messages=GOOD)
        assert missing.value.param == "model"
        with pytest.raises(openai.BadRequestError) as bad:
            client.chat.completions.create(model=MODEL, messages=GOOD, max_tokens=0)
        assert bad.value.param == "max_tokens"
    with openai.OpenAI(base_url=proxy_server.openai_base_url(), api_key="sk-wrong", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model=MODEL, messages=GOOD)


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "Basic abc"}, {"x-api-key": "nope"}],
    ids=["missing", "wrong", "not-bearer", "wrong-x-api-key"],
)
@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/v1/traces",
        "/rollout/r1/attempt/a1/v1/chat/completions",
    ],
)
def test_missing_or_wrong_key_is_401(proxy_server: Any, headers: dict[str, str], path: str) -> None:
    response = httpx.post(
        f"{proxy_server.base_url}{path}",
        content=_chat(),
        headers={"content-type": "application/json", **headers},
        timeout=NO_DEADLINE,
    )
    error = _check_error(response, 401, None)
    assert error["type"] == "authentication_error"


def test_other_key_headers_are_accepted(proxy_server: Any) -> None:
    rid = new_id("keyhdr")
    for header in ("x-api-key", "api-key"):
        response = httpx.post(
            f"{proxy_server.base_url}/rollout/{rid}/attempt/a1/v1/chat/completions",
            content=_chat(),
            headers={"content-type": "application/json", header: proxy_server.api_key},
            timeout=60,
        )
        assert response.status_code == 200, response.text
    assert len(stored_calls(proxy_server, rid)) == 2


def test_liveness_needs_no_key(proxy_server: Any) -> None:
    assert httpx.get(f"{proxy_server.base_url}/health/liveliness", timeout=NO_DEADLINE).status_code == 200


@pytest.mark.parametrize(
    ("path", "headers", "param"),
    [
        ("/rollout/bad%20id/attempt/a1/v1/chat/completions", {}, "x-rollout-id"),
        ("/rollout/-dash/attempt/a1/v1/chat/completions", {}, "x-rollout-id"),
        ("/rollout//attempt/a1/v1/chat/completions", {}, "x-rollout-id"),
        (f"/rollout/{'r' * 129}/attempt/a1/v1/chat/completions", {}, "x-rollout-id"),
        ("/rollout/r1/attempt/a$1/v1/chat/completions", {}, "x-attempt-id"),
        ("/v1/chat/completions", {"x-rollout-id": "has space"}, "x-rollout-id"),
        ("/v1/chat/completions", {"x-rollout-id": "r1", "x-attempt-id": "a/1"}, "x-attempt-id"),
        ("/v1/chat/completions", {"x-attempt-id": "a1"}, "x-attempt-id"),
    ],
    ids=[
        "space",
        "leading-dash",
        "empty",
        "too-long",
        "attempt-dollar",
        "header-space",
        "header-slash",
        "attempt-alone",
    ],
)
def test_malformed_rollout_ids_are_refused_before_any_work(
    proxy_server: Any, path: str, headers: dict[str, str], param: str
) -> None:
    before = len(proxy_server.sampler.served)
    headers = _headers(proxy_server, **headers)
    response = httpx.post(f"{proxy_server.base_url}{path}", content=_chat(), headers=headers, timeout=NO_DEADLINE)
    error = _check_error(response, 400, param)
    assert error["code"] == "invalid_rollout_id"
    assert len(proxy_server.sampler.served) == before


@pytest.mark.slow
async def test_a_thousand_bad_requests_then_a_good_one(proxy_server: Any) -> None:
    """A mix over every layer that refuses (gateway, LiteLLM, our pre-call check, the chat service),
    weighted toward the cheap refusals to keep the test short: LiteLLM's error path costs ~10-50 ms."""
    key = {"Authorization": f"Bearer {proxy_server.api_key}", "content-type": "application/json"}
    bodies = {name: (body, status) for name, body, status, _ in BAD_BODIES}
    cycle: list[tuple[str, bytes, dict[str, str], int]] = [
        # gateway: key, rollout ids, bodies that are not JSON objects (12 of 20)
        ("/v1/chat/completions", _chat(), {"content-type": "application/json"}, 401),
        ("/v1/chat/completions", _chat(), {**key, "Authorization": "Bearer sk-wrong"}, 401),
        ("/v1/completions", _chat(), {"content-type": "application/json"}, 401),
        ("/v1/chat/completions", _chat(), {**key, "x-rollout-id": "no good"}, 400),
        ("/v1/chat/completions", _chat(), {**key, "x-attempt-id": "lonely"}, 400),
        ("/rollout/r%201/attempt/a1/v1/chat/completions", _chat(), key, 400),
        ("/rollout/r1/attempt/a%24/v1/chat/completions", _chat(), key, 400),
        *[
            ("/v1/chat/completions", bodies[name][0], key, bodies[name][1])
            for name in ("not-json", "json-list", "json-null", "json-string", "not-json")
        ],
        # LiteLLM and our pre-call check (6 of 20)
        *[
            ("/v1/chat/completions", bodies[name][0], key, bodies[name][1])
            for name in (
                "malformed-json",
                "missing-messages",
                "unknown-model",
                "unknown-role",
                "content-int",
                "tools-not-a-list",
            )
        ],
        # the chat service and the completions route (2 of 20)
        ("/v1/chat/completions", bodies["max-tokens-zero"][0], key, 400),
        ("/v1/completions", json.dumps({"model": MODEL, "prompt": [1, 10**7]}).encode(), key, 400),
    ]
    assert len(cycle) == 20
    pending: asyncio.Queue[tuple[str, bytes, dict[str, str], int]] = asyncio.Queue()
    for request in itertools.islice(itertools.cycle(cycle), 1000):
        pending.put_nowait(request)
    outcomes: list[tuple[int, int, bool]] = []

    async with httpx.AsyncClient(
        base_url=proxy_server.base_url, timeout=60, limits=httpx.Limits(max_connections=16)
    ) as client:

        async def worker() -> None:
            while not pending.empty():
                path, body, headers, expected = pending.get_nowait()
                response = await client.post(path, content=body, headers=headers)
                outcomes.append((response.status_code, expected, "error" in response.json()))

        await asyncio.gather(*(worker() for _ in range(16)))
        assert len(outcomes) == 1000
        assert [o for o in outcomes if o[0] != o[1] or not o[2]] == []
        rid = new_id("after")
        good = await client.post(
            f"/rollout/{rid}/attempt/a1/v1/chat/completions",
            content=_chat(messages=[{"role": "user", "content": f"[{rid}]"}]),
            headers=key,
        )
    assert good.status_code == 200, good.text
    assert len(stored_calls(proxy_server, rid)) == 1
