"""`agl-bridge serve` as a user runs it: a subprocess that prints its URL and key, serves chat calls
into its --store and stops on Ctrl-C; and its refusals of unsafe or impossible binds (one line, exit 2).

The serve subprocess is started early, with the first proxy test (tests/proxy/conftest.py). The
refusals run the same command in-process (typer's CliRunner): the CLI loads the model before it
looks at --host/--api-key/--port, so each refusal as a subprocess would cost a full model load
(~10 s of CPU on the shared cores). The real subprocess shows stderr is clean up to its first line.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from proxy_helpers import ServeProcess
from shared_helpers import AGL_BRIDGE

from agl_bridge.store import SQLiteStore
from agl_bridge.testing.proxy_process import child_env


async def stored_attempt(store: Path, rollout_id: str, attempt_id: str) -> Any:
    """The attempt as the serve process's store holds it (read from this process)."""
    async with SQLiteStore(store) as opened:
        return await opened.get_attempt(attempt_id, rollout_id)


SERVING = re.compile(
    r"agl-bridge is serving '(?P<name>[^']+)' \((?P<path>.+)\) at (?P<url>http://127\.0\.0\.1:(?P<port>\d+)/v1)$"
)
KEY = re.compile(r"^\s*key: (?P<key>\S+)")


@pytest.fixture
def refuse_to_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make an in-process `serve` that got past its checks fail instead of serving (and blocking) forever."""
    from agl_bridge.proxy.server import ProxyServer

    def serve_forever(self: Any, on_ready: Any = None) -> None:
        raise AssertionError("agl-bridge serve started serving instead of refusing")

    monkeypatch.setattr(ProxyServer, "serve_forever", serve_forever)
    for name in ("AGL_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def _refusal(args: list[str]) -> str:
    from typer.testing import CliRunner

    from agl_bridge.cli import app

    result = CliRunner().invoke(app, ["serve", *args])
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stdout == "" and "Traceback" not in result.output
    return lines[0]


def test_public_host_without_a_key_exits_2_with_one_line(
    refuse_to_serve: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    line = _refusal(
        ["--model", str(tiny_model_dir), "--host", "0.0.0.0", "--port", "0", "--store", str(tmp_path / "s.sqlite")]
    )
    assert line.startswith("Error: ") and "0.0.0.0" in line and "--api-key" in line
    assert not (tmp_path / "s.sqlite").exists()


def test_port_in_use_exits_2_with_one_line(refuse_to_serve: None, tiny_model_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = _refusal(["--model", str(tiny_model_dir), "--port", str(port), "--store", str(tmp_path / "s.sqlite")])
    assert line.startswith("Error: ") and f"127.0.0.1:{port}" in line and "in use" in line and "--port" in line


@pytest.mark.slow
def test_serve_prints_url_and_key_answers_and_records_into_the_store(
    serve_process: ServeProcess, tiny_model_dir: Path, tmp_path: Path
) -> None:
    server = serve_process
    serving = server.wait_for(SERVING)
    assert server.seen[0] == serving.string, "nothing is printed on stderr before the serving line"
    key = server.wait_for(KEY)["key"]
    assert serving["name"] == "tiny" and Path(serving["path"]) == tiny_model_dir
    assert key.startswith("sk-agl-")
    per_rollout = server.wait_for(re.compile(r"per rollout: (\S+)"))[1]
    assert per_rollout == f"http://127.0.0.1:{serving['port']}/rollout/ROLLOUT_ID/attempt/ATTEMPT_ID/v1"
    server.wait_for(re.compile(re.escape(str(server.store.resolve()))))

    base = serving["url"].removesuffix("/v1")
    assert httpx.get(f"{base}/health/liveliness", timeout=10).status_code == 200
    assert (
        httpx.post(f"{serving['url']}/chat/completions", json={}, headers={"Authorization": "Bearer nope"}).status_code
        == 401
    )
    url = per_rollout.replace("ROLLOUT_ID", "cli-ro").replace("ATTEMPT_ID", "cli-at")
    with openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=60) as client:
        reply = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hello from the CLI test"}],
            max_tokens=5,
            extra_body={"return_token_ids": True},
        )
    # Nobody finishes that rollout: the idle timeout (1 s) ends it, explicitly, as timed_out.
    assert "idle rollouts time out after 1 s" in server.wait_for(re.compile(r"lifecycle: POST .*"))[0]
    deadline = time.monotonic() + 60
    while (attempt := asyncio.run(stored_attempt(server.store, "cli-ro", "cli-at"))).status.value == "running":
        assert time.monotonic() < deadline, "the idle rollout was never timed out"
        time.sleep(0.2)
    assert attempt.status.value == "timed_out" and "idle timeout" in (attempt.error or "")
    finish = httpx.post(
        f"{base}/rollout/cli-ro/attempt/cli-at/finish",
        json={"status": "succeeded"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert finish.status_code == 409 and "already finished (timed_out)" in finish.json()["error"]["message"]

    # The access log: one line per request on stderr (on by default), never the key or the content.
    logged = server.wait_for(
        re.compile(
            r"POST /v1/chat/completions rollout=cli-ro attempt=cli-at key=operator status=200 prompt_tokens=(\d+) "
            r"completion_tokens=(\d+) latency_ms=[\d.]+$"
        )
    )
    assert reply.usage is not None and (int(logged[1]), int(logged[2])) == (
        reply.usage.prompt_tokens,
        reply.usage.completion_tokens,
    )
    server.wait_for(re.compile(r"POST /v1/chat/completions rollout=- attempt=- key=none status=401 prompt_tokens=0 "))
    access = [line for line in server.seen if " status=" in line]
    assert not any(key in line or "hello from the CLI test" in line for line in access)
    assert not any("/health/" in line for line in server.seen)

    server.process.send_signal(signal.SIGINT)  # Ctrl-C: a clean stop that closes the store
    assert server.process.wait(timeout=60) == 0, "".join(server.seen)

    out = server.folder / "calls.jsonl"
    exported = subprocess.run(
        [AGL_BRIDGE, "export", "--store", str(server.store), "--what", "calls", "--out", str(out)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert exported.returncode == 0, exported.stderr
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert (record["kind"], record["rollout_id"], record["attempt_id"]) == ("llm_call", "cli-ro", "cli-at")
    assert record["prompt_token_ids"] == reply.model_extra["prompt_token_ids"]
    assert record["response_token_ids"] == reply.choices[0].model_extra["token_ids"]
    assert record["response_text"] == reply.choices[0].message.content
    assert record["messages"] == [{"role": "user", "content": "hello from the CLI test"}]
