"""A recording reverse proxy between an agent and `agl-bridge serve`: what the agent sent and what it got back.

The server's access log says nothing of request bodies or of when an agent hung up, so the agent
tests put this tap in front of it: every exchange's method, path, status and request body is kept,
which is how a test knows the agent reached the proxy, that no well-formed request got a 4xx/5xx,
which fields each agent sends, and which streams the agent left before their end. Bodies pass
through byte for byte and responses are streamed chunk by chunk, so streaming agents see the
server's own timing.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

# How a stream reports an error after its 200: Anthropic's `event: error`, OpenAI's `data: {"error": ...}`.
_STREAM_ERRORS = (b"event: error", b'data: {"error"')
# How each protocol's stream ends: Chat Completions and Completions `[DONE]`, Responses' last events, Anthropic's.
_STREAM_ENDS = (b"data: [DONE]", b"response.completed", b"response.incomplete", b"response.failed", b"message_stop")
# Hop-by-hop and length headers: aiohttp sets them again for each leg.
_REQUEST_DROP = {"host", "content-length", "transfer-encoding", "connection", "accept-encoding"}
_RESPONSE_DROP = {"content-length", "transfer-encoding", "connection"}
_SESSION = web.AppKey("session", aiohttp.ClientSession)


@dataclass(frozen=True)
class Exchange:
    """One request through the tap: what was asked and how the server answered."""

    method: str
    path: str
    status: int
    request_body: bytes
    response_head: bytes  # the first bytes of the response body (error messages, the first stream events)
    stream_error: bool = False  # a 2xx stream that carried an error event (how a streamed request fails)
    abandoned: bool = False  # the agent hung up before the stream's end event: the proxy cancels, records nothing

    def request_json(self) -> dict[str, Any]:
        """The request body as JSON ({} when it is empty or not JSON)."""
        try:
            body = json.loads(self.request_body)
        except ValueError:
            return {}
        return body if isinstance(body, dict) else {}

    @property
    def failed(self) -> bool:
        """Refused (4xx/5xx), or answered 2xx with an error event in the stream."""
        return self.status >= 400 or self.stream_error

    def describe(self) -> str:
        """One line for assertion messages."""
        head = self.response_head[:300].decode("utf-8", "replace")
        error = " (error event in the stream)" if self.stream_error else ""
        return f"{self.method} {self.path} -> {self.status}{error}: {head}"


class HttpTap:
    """Listens on 127.0.0.1:`port` and forwards everything to `upstream` (an http://host:port origin)."""

    def __init__(self, upstream: str, port: int) -> None:
        self.upstream = upstream.rstrip("/")
        self.port = port
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()

    @property
    def origin(self) -> str:
        """The tap's own http://host:port."""
        return f"http://127.0.0.1:{self.port}"

    def since(self, count: int) -> list[Exchange]:
        """The exchanges recorded after the first `count`."""
        with self._lock:
            return self.exchanges[count:]

    def __len__(self) -> int:
        with self._lock:
            return len(self.exchanges)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _REQUEST_DROP}
        session = request.app[_SESSION]
        head = b""
        stream_error = ended = left = False
        carry = b""  # the stream's last bytes so far, so a marker split across chunks is still seen
        async with session.request(
            request.method, self.upstream + request.rel_url.path_qs, headers=headers, data=body, allow_redirects=False
        ) as upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in _RESPONSE_DROP:
                    response.headers.add(key, value)
            streamed = upstream.content_type == "text/event-stream"
            await response.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    if len(head) < 4096:
                        head += chunk[: 4096 - len(head)]
                    window = carry + chunk
                    stream_error = stream_error or any(marker in window for marker in _STREAM_ERRORS)
                    ended = ended or any(marker in window for marker in _STREAM_ENDS)
                    carry = window[-32:]
                    await response.write(chunk)
                await response.write_eof()
            except ConnectionResetError:
                left = True  # Codex hangs up once it has `response.completed`; opencode leaves its title call
            finally:
                abandoned = left and streamed and not ended
                with self._lock:
                    self.exchanges.append(
                        Exchange(request.method, request.path, upstream.status, body, head, stream_error, abandoned)
                    )
        return response

    @contextmanager
    def running(self) -> Iterator[HttpTap]:
        """Serve in a thread of its own until the block ends."""
        loop = asyncio.new_event_loop()
        started = threading.Event()
        stop: asyncio.Event | None = None

        async def serve() -> None:
            nonlocal stop
            stop = asyncio.Event()
            app = web.Application(client_max_size=256 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._forward)
            timeout = aiohttp.ClientTimeout(total=None, sock_read=900)
            async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
                app[_SESSION] = session
                runner = web.AppRunner(app, access_log=None)
                await runner.setup()
                await web.TCPSite(runner, "127.0.0.1", self.port).start()
                started.set()
                await stop.wait()
                await runner.cleanup()

        thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
        thread.start()
        if not started.wait(30):
            raise RuntimeError(f"the HTTP tap did not start on port {self.port}")
        try:
            yield self
        finally:
            assert stop is not None
            loop.call_soon_threadsafe(stop.set)
            thread.join(timeout=30)
            loop.close()
