"""One module shapes every refusal: each kind of failure becomes the same protocol-neutral error, then
OpenAI's wire shape; LiteLLM gets its own exceptions carrying the same status, param and code."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from litellm.proxy._types import ProxyException
from starlette.exceptions import HTTPException

from agl_bridge.proxy.errors import (
    WireProtocol,
    api_error,
    error_body,
    to_litellm_error,
    to_proxy_exception,
    with_word_codes,
)
from agl_bridge.proxy.request import RequestError
from agl_bridge.sampler.remote_errors import RemoteSamplerError
from agl_bridge.store.errors import StoreClosedError

INVALID, SERVER = "invalid_request_error", "server_error"
CASES = [
    (RequestError("n must be at most 64, got 65", "n"), 400, INVALID, "n", "invalid_value"),
    (RequestError("not loaded", "model", code="model_not_found", status=404), 404, INVALID, "model", "model_not_found"),
    (StoreClosedError("the store is closed"), 503, SERVER, None, "store_unavailable"),
    (RemoteSamplerError("no sampler server answered"), 503, SERVER, None, "sampler_unavailable"),
    (ProxyException(message="bad", type=INVALID, param="None", code="400"), 400, INVALID, None, "invalid_value"),
    (HTTPException(405), 405, INVALID, None, "method_not_allowed"),
    (
        RequestValidationError([{"loc": ("body", "lora_name"), "msg": "required"}]),
        400,
        INVALID,
        "lora_name",
        "invalid_value",
    ),
    (KeyError("bug"), 500, SERVER, None, "internal_error"),
]


@pytest.mark.parametrize(("exc", "status", "type_", "param", "code"), CASES, ids=[type(c[0]).__name__ for c in CASES])
def test_every_failure_becomes_an_openai_error_with_a_word_code(
    exc: BaseException, status: int, type_: str, param: str | None, code: str
) -> None:
    error = api_error(exc, method="DELETE", path="/v1/completions")
    assert (error.status, error.type, error.param, error.code) == (status, type_, param, code)
    body = error_body(error, WireProtocol.OPENAI)
    assert body == {"error": {"message": error.message, "type": type_, "param": param, "code": code}}
    assert error.message and "Traceback" not in error.message


def test_litellm_gets_exceptions_that_carry_the_same_error() -> None:
    refusal = RequestError("max_tokens must be an integer >= 1, got 0", "max_tokens")
    hook = to_proxy_exception(refusal)
    assert (hook.code, hook.param, hook.openai_code, hook.message) == (
        "400",
        "max_tokens",
        "invalid_value",
        refusal.message,
    )
    provider = to_litellm_error(StoreClosedError("the store is closed"), "agl/tiny")
    assert (provider.status_code, provider.code, provider.type) == (503, "store_unavailable", "server_error")  # type: ignore[attr-defined]


async def test_error_bodies_litellm_writes_itself_get_a_word_code() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    fixing = with_word_codes(send)
    body = json.dumps(
        {"error": {"message": "stream failed", "type": "invalid_request_error", "param": None, "code": "400"}}
    )
    start = {"type": "http.response.start", "status": 400, "headers": [(b"content-type", b"application/json")]}
    await fixing(start)
    await fixing({"type": "http.response.body", "body": body.encode()})
    assert json.loads(sent[-1]["body"])["error"]["code"] == "invalid_value"
    assert int(dict(sent[0]["headers"])[b"content-length"]) == len(sent[-1]["body"])
