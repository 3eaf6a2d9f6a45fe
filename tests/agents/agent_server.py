"""`agl-bridge serve --model tiny` in a subprocess with an `HttpTap` in front: what the agent tests talk to."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from http_tap import HttpTap
from shared_helpers import AGL_BRIDGE, free_port

from agl_bridge.testing.proxy_process import child_env

API_KEY = "sk-agl-agent-recipes"
START_TIMEOUT_S = 300
DEFAULT_MAX_TOKENS = 8192
"""`serve --default-max-tokens`, as docs/agents.md advises: Codex sends no output limit and fails on a capped reply."""
_SERVING = re.compile(r"agl-bridge is serving '[^']+' \(.+\) at http://127\.0\.0\.1:(?P<port>\d+)/v1$")


@dataclass
class AgentServer:
    """The served tiny model, its store, and the tap every agent goes through."""

    store: Path
    api_key: str
    tap: HttpTap
    log: list[str]


def _wait_for_port(process: subprocess.Popen[str], log: list[str]) -> int:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for line in list(log):
            if match := _SERVING.search(line.rstrip()):
                return int(match["port"])
        if process.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError("`agl-bridge serve --model tiny` did not start:\n" + "".join(log[-40:]))


@contextmanager
def serve_tiny(folder: Path) -> Iterator[AgentServer]:
    """Start the server (store in `folder`), wait until it serves, put the tap in front; stop it by PID after."""
    store = folder / "store.sqlite"
    command = [AGL_BRIDGE, "serve", "--model", "tiny", "--port", "0", "--store", str(store), "--api-key", API_KEY]
    command += ["--default-max-tokens", str(DEFAULT_MAX_TOKENS)]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=folder
    )
    log: list[str] = []
    stderr = process.stderr
    assert stderr is not None
    threading.Thread(target=lambda: log.extend(iter(stderr.readline, "")), daemon=True).start()
    try:
        port = _wait_for_port(process, log)
        with HttpTap(f"http://127.0.0.1:{port}", free_port()).running() as tap:
            yield AgentServer(store, API_KEY, tap, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
