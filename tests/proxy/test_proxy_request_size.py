"""The request-body limit on the running proxy, and which path a chat request takes."""

from __future__ import annotations

from typing import Any

import httpx
from proxy_helpers import MODEL, auth, stored_calls
from shared_helpers import new_id

from agl_bridge.chat import TextBound
from agl_bridge.proxy.server import MIN_MAX_REQUEST_BYTES, max_request_bytes


def test_the_default_limit_fits_any_prompt_the_context_window_holds() -> None:
    # 40,960 tokens of at most 64 bytes (NFC: x4 characters), 6 bytes of JSON per character
    assert max_request_bytes(TextBound(64, 4), 40_960) == 6 * 256 * 40_960
    assert (
        max_request_bytes(TextBound(16, 4), 4096) == MIN_MAX_REQUEST_BYTES
    )  # the tiny model at 4,096 tokens: the floor
    assert max_request_bytes(TextBound(None), 200_000) == 6 * 32 * 200_000  # no bound known: 32 per token


def test_a_body_over_the_limit_is_refused_and_the_server_stays_up(proxy_server: Any) -> None:
    limit = proxy_server.max_request_bytes
    assert limit == max_request_bytes(proxy_server.codec.text_bound, proxy_server.sampler.max_context)  # the default
    rid = new_id("huge")
    url = f"{proxy_server.base_url}/rollout/{rid}/attempt/a1/v1/chat/completions"
    huge = {"model": MODEL, "messages": [{"role": "user", "content": "word " * (limit // 5 + 1)}]}
    refused = httpx.post(url, json=huge, headers=auth(proxy_server), timeout=60)
    assert refused.status_code == 413
    assert refused.json()["error"]["code"] == "request_too_large"
    small = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    answered = httpx.post(url, json=small, headers=auth(proxy_server), timeout=60)
    assert answered.status_code == 200, answered.text
    assert len(stored_calls(proxy_server, rid)) == 1


def test_a_prompt_that_cannot_fit_is_refused_by_its_length(proxy_server: Any) -> None:
    rid = new_id("long")
    # ASCII text: at least one token per `bytes_per_token` characters, so this many cannot fit the window
    words = proxy_server.codec.text_bound.bytes_per_token * proxy_server.sampler.max_context // 5 + 1
    body = {"model": MODEL, "messages": [{"role": "user", "content": "word " * words}], "stream": True}
    refused = httpx.post(
        f"{proxy_server.base_url}/rollout/{rid}/attempt/a1/v1/chat/completions",
        json=body,
        headers=auth(proxy_server),
        timeout=60,
    )
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["param"], error["code"]) == ("messages", "context_length_exceeded")
    assert "characters long" in error["message"]
    assert stored_calls(proxy_server, rid) == []


def test_the_served_model_is_answered_without_litellm(proxy_server: Any) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    response = httpx.post(
        f"{proxy_server.base_url}/v1/chat/completions", json=body, headers=auth(proxy_server), timeout=60
    )
    assert response.status_code == 200
    assert not [name for name in response.headers if name.startswith("x-litellm")]  # LiteLLM's pipeline adds these
    models = httpx.get(f"{proxy_server.base_url}/v1/models", headers=auth(proxy_server), timeout=60)
    assert [m["id"] for m in models.json()["data"]] == [MODEL]  # LiteLLM still serves its routes
