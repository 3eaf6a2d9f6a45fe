"""Helpers for the reliability tests: the OpenAI error-shape check, store checks, a proxy subprocess.

LiteLLM's proxy is one per process, so tests that kill or freeze a proxy run it in a subprocess
(`serve_subprocess.py`) and always stop it in a `finally` (see `ProxyProcess`).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SERVE_SCRIPT = HERE / "serve_subprocess.py"
START_TIMEOUT_S = 180.0


def new_id(prefix: str) -> str:
    """A rollout id no other test uses (the session proxy and its store are shared)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def openai_error_problem(response: httpx.Response) -> str | None:
    """Why `response` is not a 4xx OpenAI-style error, or None if it is one.

    The shape: `{"error": {"message": str, "type": str, "param": str|null, "code": str|int|null}}`;
    `code` is a word (or null), never the HTTP status repeated as a string.
    """
    if not 400 <= response.status_code < 500:
        return f"status {response.status_code} is not 4xx"
    try:
        body = response.json()
    except ValueError:
        return f"body is not JSON: {response.text[:200]!r}"
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], dict):
        return f"body is not {{'error': {{...}}}}: {body!r:.300}"
    error = body["error"]
    missing = {"message", "type", "param", "code"} - set(error)
    if missing:
        return f"error lacks {sorted(missing)}: {error!r:.300}"
    if not isinstance(error["message"], str) or not error["message"] or "Traceback" in error["message"]:
        return f"message is not a plain non-empty string: {error['message']!r:.300}"
    if not isinstance(error["type"], str) or not error["type"]:
        return f"type is not a string: {error['type']!r}"
    if error["param"] is not None and not isinstance(error["param"], str):
        return f"param is not a string or null: {error['param']!r}"
    code = error["code"]
    if code is not None and not isinstance(code, (str, int)) or isinstance(code, bool):
        return f"code is not a string, integer or null: {code!r}"
    if isinstance(code, str) and code.isdigit():
        return f"code is the HTTP status as a string ({code!r}), not an error code"
    return None


def integrity(path: str | os.PathLike[str]) -> str:
    """`PRAGMA integrity_check` of a SQLite file, from a fresh connection ("ok" when intact)."""
    with sqlite3.connect(path) as conn:
        return ";".join(row[0] for row in conn.execute("PRAGMA integrity_check"))


def query(path: str | os.PathLike[str], sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows of a read-only query on a store file, from a fresh connection."""
    with sqlite3.connect(path) as conn:
        return conn.execute(sql, params).fetchall()


def child_env() -> dict[str, str]:
    """The environment for subprocesses: offline switches on, no keys or rollout variables inherited."""
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    for name in ("AGL_API_KEY", "OPENAI_API_KEY", "AGL_ROLLOUT_ID", "AGL_ATTEMPT_ID", "AGL_ENDPOINT"):
        env.pop(name, None)
    return env


@dataclass
class ProxyProcess:
    """A proxy in a subprocess (`serve_subprocess.py`): its process, URL and key."""

    process: subprocess.Popen[str]
    base_url: str
    api_key: str
    store: Path

    def rollout_url(self, rollout_id: str, attempt_id: str) -> str:
        """The OpenAI base URL of one rollout attempt."""
        return f"{self.base_url}/rollout/{rollout_id}/attempt/{attempt_id}/v1"

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush, no cleanup — a crash."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        """Stop it whatever state it is in (resumed first if frozen); safe to call twice."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
        self.process.wait(timeout=30)
        if self.process.stdout is not None:
            self.process.stdout.close()


def start_proxy(
    store: Path,
    model_dir: Path,
    *,
    sampler: str = "instant",
    token_delay_s: float = 0.0,
    tokens: int = 8,
    api_key: str = "sk-reliability",
) -> ProxyProcess:
    """Start `serve_subprocess.py` on a free port and wait until it answers; the caller must `stop()` it."""
    command = [
        sys.executable,
        str(SERVE_SCRIPT),
        "--store",
        str(store),
        "--model-dir",
        str(model_dir),
        "--sampler",
        sampler,
        "--token-delay",
        str(token_delay_s),
        "--tokens",
        str(tokens),
        "--key",
        api_key,
    ]
    log = (store.parent / f"{store.stem}.proxy.log").open("a")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, env=child_env(), cwd=REPO)
    log.close()
    assert process.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if line.startswith("READY "):
                port = int(line.split()[1])
                return ProxyProcess(process, f"http://127.0.0.1:{port}", api_key, store)
            if not line and process.poll() is not None:
                break
        log_text = (store.parent / f"{store.stem}.proxy.log").read_text()[-3000:]
        raise AssertionError(f"the proxy subprocess did not start (exit code {process.poll()}):\n{log_text}")
    except BaseException:
        process.kill()
        process.wait(timeout=30)
        raise
