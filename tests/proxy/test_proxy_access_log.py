"""The access log: one line per request — method, path, rollout, status, tokens, latency — for every route and
protocol, streams included (logged when they end); never the key or the content."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from proxy_helpers import MODEL, auth, stored_calls
from shared_helpers import new_id

from agl_bridge.proxy.access_log import ACCESS_LOGGER, access_line
from agl_bridge.proxy.request import RequestTokens

LINE = re.compile(
    r"^(?P<method>\S+) (?P<path>\S+) rollout=(?P<rollout>\S+) attempt=(?P<attempt>\S+) key=(?P<key>\S+) "
    r"status=(?P<status>\d+) "
    r"prompt_tokens=(?P<prompt>\d+) completion_tokens=(?P<completion>\d+) latency_ms=(?P<ms>[\d.]+)$"
)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
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


def _line(lines: list[str], rollout: str) -> re.Match[str]:
    (line,) = [line for line in lines if f"rollout={rollout} " in line]
    match = LINE.match(line)
    assert match is not None, line
    return match


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/completions"])
def test_each_request_is_one_line_with_its_tokens(
    proxy_server: Any, access_lines: list[str], path: str, stream: bool
) -> None:
    rid = new_id("log")
    secret = f"secret content {rid}"
    if path == "/v1/responses":
        body: dict[str, Any] = {"input": secret, "max_output_tokens": 3}
    elif path == "/v1/completions":
        body = {"prompt": secret, "max_tokens": 3}
    else:
        body = {"messages": [{"role": "user", "content": secret}], "max_tokens": 3}
    answered = httpx.post(
        f"{proxy_server.base_url}/rollout/{rid}/attempt/a1{path}",
        json={"model": MODEL, "stream": stream, **body},
        headers=auth(proxy_server),
        timeout=60,
    )
    assert answered.status_code == 200, answered.text[:300]
    (call,) = stored_calls(proxy_server, rid)
    line = _line(access_lines, rid)
    assert (line["method"], line["path"], line["attempt"], line["status"]) == ("POST", path, "a1", "200")
    assert (int(line["prompt"]), int(line["completion"])) == (
        len(call.prompt_token_ids),
        len(call.response_token_ids),
    )
    assert float(line["ms"]) > 0
    assert not any(secret in text or proxy_server.api_key in text for text in access_lines)


def test_refusals_are_logged_with_their_status(proxy_server: Any, access_lines: list[str]) -> None:
    rid = new_id("log-refused")
    httpx.post(f"{proxy_server.base_url}/rollout/{rid}/attempt/a1/v1/chat/completions", json={}, timeout=30)
    httpx.post(
        f"{proxy_server.base_url}/v1/chat/completions",
        json={"model": MODEL, "messages": []},
        headers={**auth(proxy_server), "x-rollout-id": rid + "-h"},
        timeout=30,
    )
    assert _line(access_lines, rid)["status"] == "401"
    refused = _line(access_lines, rid + "-h")
    assert (refused["status"], refused["prompt"], refused["completion"]) == ("400", "0", "0")


def test_what_the_client_chose_stays_on_one_line() -> None:
    line = access_line("GET", "/v1/x\nforged line", "r 1", None, 404, RequestTokens(), 0.001)
    assert "\n" not in line and LINE.match(line) is not None
