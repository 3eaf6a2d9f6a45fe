"""`agl-bridge serve --workers N`: N proxy processes on one port over a remote sampler and one PostgreSQL store.

Requests come on fresh connections, which the kernel spreads across the workers (SO_REUSEPORT);
one worker is then killed and the other keeps serving every rollout, including turns of
conversations the dead one served. Refused, in one line, with the in-process hf sampler.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from proxy_helpers import ServeProcess
from shared_helpers import AGL_BRIDGE, new_id

from agl_bridge.store import PostgresStore
from agl_bridge.testing.proxy_process import ProxyProcess, child_env, start_proxy

SERVING = re.compile(r"agl-bridge is serving 'tiny' \(.+\) at http://127\.0\.0\.1:(?P<port>\d+)/v1 \(2 processes")


@pytest.mark.slow
def test_workers_with_the_in_process_sampler_are_refused_in_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [AGL_BRIDGE, "serve", "--model", str(tiny_model_dir), "--workers", "2", "--store", str(tmp_path / "s.db")],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "--workers 2" in line and "--sampler hf" in line and "single-process" in line and "--sampler remote" in line


@pytest.fixture
def remote(tiny_model_dir: Path, tmp_path: Path) -> Iterator[ProxyProcess]:
    """An instant sampler behind its own proxy: the remote backend the workers sample from."""
    backend = start_proxy(tmp_path / "remote.db", tiny_model_dir)
    try:
        yield backend
    finally:
        backend.stop()


def _workers(pid: int) -> list[int]:
    """The serve workers of `pid`: its children started by multiprocessing's spawn (not its resource tracker)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    spawned = b"spawn_main" in cmdline.read()
            except OSError:
                continue
            if parent == pid and spawned:
                found.append(int(entry))
    return found


def _turn(port: int, rollout_id: str, messages: list[dict[str, str]]) -> str:
    with httpx.Client(headers={"Authorization": "Bearer sk-workers"}, timeout=60) as client:  # a fresh connection
        answer = client.post(
            f"http://127.0.0.1:{port}/rollout/{rollout_id}/attempt/0/v1/chat/completions",
            json={"model": "tiny", "messages": messages, "max_tokens": 8},
        )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["choices"][0]["message"]["content"])


@pytest.mark.slow
async def test_two_workers_share_one_port_and_one_keeps_serving_every_rollout_when_the_other_dies(
    remote: ProxyProcess, postgres_dsn: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    command = [AGL_BRIDGE, "serve", "--model", str(tiny_model_dir), "--workers", "2", "--port", "0"]
    command += ["--sampler", "remote", "--sampler-url", remote.base_url, "--sampler-api-key", remote.api_key]
    command += ["--store", postgres_dsn, "--api-key", "sk-workers"]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=tmp_path
    )
    serve = ServeProcess(process, tmp_path, tmp_path)
    assert process.stderr is not None
    threading.Thread(target=lambda: [serve.lines.put(line) for line in process.stderr], daemon=True).start()
    try:
        port = int(serve.wait_for(SERVING)["port"])
        workers = _workers(process.pid)
        assert len(workers) == 2, workers
        conversations = {new_id("w"): [{"role": "user", "content": f"task {n}"}] for n in range(6)}
        for turn in range(4):
            if turn == 2:  # half-way: one worker dies; the kernel stops routing to its socket
                os.kill(workers[0], signal.SIGKILL)
                serve.wait_for(re.compile(r"serve worker \d \(pid \d+\) exited .* 1 still serves"))
            for rollout_id, messages in conversations.items():
                reply = _turn(port, rollout_id, messages)
                messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"turn {turn}"}]
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
        assert all(not os.path.exists(f"/proc/{pid}/stat") or _zombie(pid) for pid in workers)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    async with PostgresStore(postgres_dsn) as store:
        for rollout_id in conversations:
            calls = [c async for c in store.iter_llm_calls(rollout_id, "0")]
            assert [c.sequence for c in calls] == [0, 1, 2, 3], "every turn recorded once, in order"
            for before, after in zip(calls, calls[1:], strict=False):
                expected = before.prompt_token_ids + before.response_token_ids
                assert after.prompt_token_ids[: len(expected)] == expected


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
