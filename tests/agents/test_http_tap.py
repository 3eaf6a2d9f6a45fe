"""The tap tells a stream the agent read to its end from one the agent left before it."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from http_tap import HttpTap
from shared_helpers import free_port

EVENTS = 20
"""Events in the upstream's stream, the last `data: [DONE]`; sent 20 ms apart so a hang-up lands mid-stream."""


class _SlowStream(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for number in range(EVENTS - 1):
                self.wfile.write(f'data: {{"n": {number}}}\n\n'.encode())
                self.wfile.flush()
                time.sleep(0.02)
            self.wfile.write(b"data: [DONE]\n\n")
        except OSError:
            pass  # the tap hung up on us once its client had

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def tap() -> Iterator[HttpTap]:
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _SlowStream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        with HttpTap(f"http://127.0.0.1:{upstream.server_port}", free_port()).running() as running:
            yield running
    finally:
        upstream.shutdown()
        upstream.server_close()


def _post(tap: HttpTap, read_all: bool) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", tap.port, timeout=30)
    connection.request("POST", "/v1/chat/completions", body=b'{"stream": true}')
    response = connection.getresponse()
    assert response.status == 200
    if read_all:
        assert response.read().endswith(b"data: [DONE]\n\n")
    else:
        response.read1(64)  # the first event, then hang up
    connection.close()


def _next_exchange(tap: HttpTap, seen: int) -> bool:
    deadline = time.monotonic() + 30
    while len(tap) == seen:
        assert time.monotonic() < deadline, "the tap recorded no exchange"
        time.sleep(0.01)
    (exchange,) = tap.since(seen)
    return exchange.abandoned


def test_a_stream_left_before_its_end_is_marked_abandoned_and_a_read_one_is_not(tap: HttpTap) -> None:
    _post(tap, read_all=True)
    assert _next_exchange(tap, 0) is False
    _post(tap, read_all=False)
    assert _next_exchange(tap, 1) is True
