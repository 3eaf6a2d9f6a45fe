"""A client that leaves before its answer is complete stops its sample: an agent whose HTTP client times
out (and retries) must not leave the sampler busy with an answer nobody reads, and nothing is recorded."""

from __future__ import annotations

import json
import socket
import time
from typing import Any
from urllib.parse import urlsplit

import pytest
from proxy_helpers import MODEL, stored_calls
from shared_helpers import new_id

LONG = {"model": MODEL, "prompt": "Once upon a time", "ignore_eos": True, "max_tokens": 60_000}
"""A sample that would run for many minutes on CPU if nothing stopped it."""


def _until(condition: Any, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_client_that_leaves_stops_its_sample_and_nothing_is_recorded(proxy_server: Any, stream: bool) -> None:
    sampler = proxy_server.sampler.inner
    rid = new_id("left")
    address = urlsplit(proxy_server.base_url)
    body = json.dumps(LONG | {"stream": stream}).encode()
    request = (
        f"POST /rollout/{rid}/attempt/a1/v1/completions HTTP/1.1\r\nHost: {address.netloc}\r\n"
        f"Authorization: Bearer {proxy_server.api_key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    _until(lambda: sampler.running_sequences == 0, "the sampler was busy before the test")
    with socket.create_connection((address.hostname, address.port)) as agent:
        agent.sendall(request)
        _until(lambda: sampler.running_sequences == 1, "the sample never started")
    _until(lambda: sampler.running_sequences == 0, "the sample went on after its client left")
    assert stored_calls(proxy_server, rid) == []
