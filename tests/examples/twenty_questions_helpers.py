"""Helpers for the Twenty Questions tests: the example on the import path, a scripted OpenAI server."""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "crewai_twenty_questions"
if str(EXAMPLE) not in sys.path:
    sys.path.insert(0, str(EXAMPLE))


@dataclass
class ScriptedOpenAIServer:
    """A tiny OpenAI-compatible chat server on 127.0.0.1 that answers from a script, in order.

    `replies` are returned one per request (the last one repeats); `status` other than 200 makes
    every request fail with that code. `requests` logs each request body. Use as a context manager.
    """

    replies: list[str]
    status: int = 200
    requests: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        script = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                script.requests.append(body)
                if script.status != 200:
                    payload = {"error": {"message": "scripted failure", "type": "server_error"}}
                    self._send(script.status, payload)
                    return
                index = min(len(script.requests) - 1, len(script.replies) - 1)
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{len(script.requests)}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body.get("model", "scripted"),
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {"role": "assistant", "content": script.replies[index]},
                            }
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    },
                )

            def _send(self, code: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        """The `/v1` base URL an OpenAI client uses."""
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> ScriptedOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@dataclass(frozen=True)
class PlainEndpoint:
    """What `play_game` needs of an endpoint."""

    base_url: str
    api_key: str = "sk-test"
    model: str = "scripted"
