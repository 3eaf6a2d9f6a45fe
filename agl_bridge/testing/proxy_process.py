"""A proxy in a subprocess (`python -m agl_bridge.testing.serve`) for tests and benchmarks that kill or freeze one.

LiteLLM's proxy is one per process, so a proxy that must die without taking the test run with it
runs in a subprocess; callers always stop it in a `finally` (see `ProxyProcess`).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from agl_bridge import semconv

START_TIMEOUT_S = 180.0

# The directory holding the `agl_bridge` this process runs: put first on the child's path so the
# subprocess runs the same code (a checkout, not whatever an editable install points at).
_PACKAGE_PARENT = Path(__file__).resolve().parents[2]

_INHERITED_SECRETS = (
    semconv.ENV_API_KEY,
    semconv.ENV_OPENAI_API_KEY,
    semconv.ENV_SAMPLER_API_KEY,
    semconv.ENV_PROXY_API_KEY,
    semconv.ENV_ROLLOUT_ID,
    semconv.ENV_ATTEMPT_ID,
    semconv.ENV_ENDPOINT,
)


def child_env() -> dict[str, str]:
    """The environment for subprocesses: offline switches on, no keys or rollout variables inherited."""
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    for name in _INHERITED_SECRETS:
        env.pop(name, None)
    return env


@dataclass
class ProxyProcess:
    """A proxy in a subprocess (`agl_bridge.testing.serve`): its process, URL and key."""

    process: subprocess.Popen[str]
    base_url: str
    api_key: str
    store: Path | str

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
    store: Path | str,
    model_dir: Path,
    *,
    sampler: str = "instant",
    token_delay_s: float = 0.0,
    tokens: int = 8,
    api_key: str = "sk-reliability",
    max_request_bytes: int | None = None,
    log_dir: Path | None = None,
    port: int = 0,
) -> ProxyProcess:
    """Start `agl_bridge.testing.serve` on a free port and wait until it answers; the caller must `stop()` it.

    store: a SQLite file (the log goes next to it) or a PostgreSQL URL (give `log_dir`).
    """
    if isinstance(store, str):
        if log_dir is None:
            raise ValueError("a proxy on a PostgreSQL store needs log_dir (where its log goes)")
        log_path = log_dir / f"proxy-{port or 'any'}-{time.monotonic_ns()}.log"
    else:
        log_dir = store.parent
        log_path = store.parent / f"{store.stem}.proxy.log"
    command = [
        sys.executable,
        "-m",
        "agl_bridge.testing.serve",
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
        "--port",
        str(port),
    ]
    if max_request_bytes is not None:
        command += ["--max-request-bytes", str(max_request_bytes)]
    log = log_path.open("a")
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_PARENT), env.get("PYTHONPATH")]))
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=log_dir)
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
        log_text = log_path.read_text()[-3000:]
        raise AssertionError(f"the proxy subprocess did not start (exit code {process.poll()}):\n{log_text}")
    except BaseException:
        process.kill()
        process.wait(timeout=30)
        raise


_SERVING = re.compile(r"^agl-bridge is serving '[^']*' \(.*\) at (?P<url>http://\S+)/v1")


def start_serve(
    model_dir: Path, store: str | Path, *options: str, api_key: str, log_path: Path, port: int = 0
) -> ProxyProcess:
    """Start `agl-bridge serve --model MODEL --store STORE --port PORT --api-key KEY *options` (the real CLI, its
    stderr — banner and access log — in `log_path`) and wait until it serves; the caller must `stop()` it."""
    command = [sys.executable, "-m", "agl_bridge.cli", "serve", "--model", str(model_dir), "--store", str(store)]
    command += ["--port", str(port), "--api-key", api_key, *options]
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_PARENT), env.get("PYTHONPATH")]))
    with log_path.open("a") as log:
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=log, text=True, env=env, cwd=log_path.parent
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            for line in log_path.read_text().splitlines():
                if (match := _SERVING.match(line)) is not None:
                    return ProxyProcess(process, match["url"], api_key, store)
            if process.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(
            f"agl-bridge serve did not start (exit code {process.poll()}):\n{log_path.read_text()[-3000:]}"
        )
    except BaseException:
        process.kill()
        process.wait(timeout=30)
        raise


def start_remote_serve(
    model_dir: Path, store: str | Path, sampler: ProxyProcess, *, api_key: str, log_path: Path
) -> ProxyProcess:
    """Start an `agl-bridge serve` on `store` that samples from `sampler` (a proxy serving the tiny model as
    `tiny`): an extra proxy of a distributed run; the caller must `stop()` it."""
    remote = ("--sampler", "remote", "--sampler-url", sampler.base_url, "--sampler-model", "tiny")
    return start_serve(
        model_dir, store, *remote, "--sampler-api-key", sampler.api_key, api_key=api_key, log_path=log_path
    )
