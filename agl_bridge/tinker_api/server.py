"""Running the Tinker API: uvicorn on a socket bound first, in the calling thread or a background one."""

from __future__ import annotations

import asyncio
import secrets
import socket
import threading
from pathlib import Path

import uvicorn

from agl_bridge.tinker_api.app import create_app
from agl_bridge.tinker_api.service import ModelMap, TinkerService

KEY_PREFIX = "tml-"
"""The SDK refuses, before sending anything, an API key that does not start with this."""


def new_api_key() -> str:
    """A fresh key the SDK accepts."""
    return KEY_PREFIX + "agl-" + secrets.token_urlsafe(24)


def check_api_key(key: str) -> str:
    """`key`, or ValueError when the SDK would refuse it."""
    if not key.startswith(KEY_PREFIX):
        raise ValueError(f"the tinker SDK only sends keys that start with {KEY_PREFIX!r}; got one that does not")
    return key


class TinkerServer:
    """The Tinker API on `sock` over a `TinkerService` rooted at `root` (checkpoints live there).

    models: recipe names → local models (`{"Qwen/Qwen3-8B": "tiny"}`). poll_s: how long a
    `retrieve_future` poll is held open before "try again".
    """

    def __init__(
        self,
        sock: socket.socket,
        root: Path,
        *,
        models: dict[str, str] | None = None,
        api_key: str | None = None,
        device: str | None = None,
        poll_s: float = 25.0,
    ) -> None:
        self.api_key = check_api_key(api_key) if api_key else new_api_key()
        self.service = TinkerService(root, ModelMap(dict(models or {})), device=device, poll_s=poll_s)
        self._sock = sock
        host, port = sock.getsockname()[:2]
        self.base_url = f"http://{host}:{port}"
        self._server = uvicorn.Server(
            uvicorn.Config(
                create_app(self.service, self.api_key), log_level="warning", access_log=False, lifespan="off"
            )
        )
        self._thread: threading.Thread | None = None

    def serve_forever(self) -> None:
        """Serve in the calling thread until interrupted (Ctrl-C / SIGTERM), then close every client."""
        try:
            asyncio.run(self._server.serve(sockets=[self._sock]))
        finally:
            self.service.close()
            self._sock.close()

    def start(self, timeout: float = 60.0) -> TinkerServer:
        """Serve from a background thread; returns once requests are answered."""
        self._thread = threading.Thread(target=self.serve_forever, name="agl-tinker", daemon=True)
        self._thread.start()
        deadline = threading.Event()
        for _ in range(int(timeout * 20)):
            if self._server.started:
                return self
            deadline.wait(0.05)
        raise RuntimeError(f"the Tinker API server did not start within {timeout:.0f}s")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop serving and wait for the thread."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> TinkerServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
