"""tinker-cookbook 0.6.1, unmodified, against our Tinker API server: `sl_loop`, `rl_loop` resuming from it, and
the capture proxy recording an agent's chat calls.

The recipes fetch their model's tokenizer and their data sets from the Hugging Face hub; here those
come from an offline HF_HOME (`agl_bridge/testing/tinker_cookbook.py`): `Qwen/Qwen3-8B` is served by the
tiny model, no_robots holds sums answered `\\boxed{0}` / `\\boxed{1}` (so after sl_loop the model
boxes its answers and rl_loop's groups get unequal rewards), gsm8k holds the sums, every answer 0.
The cookbook runs from the folder `scripts/tinker_cookbook_env.sh` builds (its pins do not resolve
on PyPI, see there), in front of .venv.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from shared_helpers import REPO, free_port

from agl_bridge.proxy.server import bind_socket
from agl_bridge.testing.tinker_cookbook import cookbook_env
from agl_bridge.tinker_api.server import TinkerServer

pytestmark = pytest.mark.slow

MODEL = "Qwen/Qwen3-8B"
# Read at import (collection), before tests/conftest.py points AGL_BRIDGE_CACHE at a per-session folder.
_SITE = Path(
    subprocess.run(
        ["bash", str(REPO / "scripts" / "tinker_cookbook_env.sh"), "--path"], capture_output=True, text=True, check=True
    ).stdout.strip()
)


@pytest.fixture(scope="module")
def cookbook_site() -> Path:
    if not (_SITE / ".agl-ready").is_file():
        pytest.skip(f"the tinker-cookbook site is not built ({_SITE}): run bash scripts/tinker_cookbook_env.sh")
    return _SITE


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinkerServer]:
    root = tmp_path_factory.mktemp("tinker-root")
    with TinkerServer(bind_socket("127.0.0.1", 0), root, models={MODEL: "tiny"}) as running:
        yield running


@pytest.fixture(scope="module")
def env(cookbook_site: Path, server: TinkerServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return cookbook_env(cookbook_site, server.base_url, server.api_key, tmp_path_factory.mktemp("hf-home"))


def _recipe(env: dict[str, str], recipe: str, *arguments: str) -> None:
    command = [sys.executable, "-m", f"tinker_cookbook.recipes.{recipe}", *arguments]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]


def _metrics(log_path: Path) -> list[dict]:
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]


def test_sl_loop_then_rl_loop_resuming_from_it(env: dict[str, str], server: TinkerServer, tmp_path: Path) -> None:
    log_path = tmp_path / "run"
    common = [f"base_url={server.base_url}", f"model_name={MODEL}", f"log_path={log_path}", "save_every=0"]
    _recipe(env, "sl_loop", *common, "batch_size=8", "learning_rate=1e-2")
    supervised = _metrics(log_path)
    assert len(supervised) == 32 and all(row["train_mean_nll"] > 0 for row in supervised)
    final = json.loads((log_path / "checkpoints.jsonl").read_text().splitlines()[-1])
    model_id = final["state_path"].removeprefix("tinker://").split("/")[0]
    assert (server.service.root / model_id / "weights" / "final").is_dir()

    # rl_loop resumes from sl_loop's last checkpoint (its batch 32) and runs batches 32-34, with its default
    # loss (stable_reinforce: recorded samples named by provenance spans).
    _recipe(
        env,
        "rl_loop",
        *common,
        "batch_size=4",
        "group_size=4",
        "max_tokens=16",
        "max_steps=35",
    )
    reinforced = [row for row in _metrics(log_path) if "reward/total" in row]
    assert [row["progress/batch"] for row in reinforced] == [32, 33, 34]
    assert all(0.0 <= row["reward/total"] <= 1.0 for row in reinforced)
    trained = [row for row in reinforced if "grad_norm:mean" in row]
    assert trained, f"every rl_loop batch had equal rewards and skipped its step: {reinforced}"


def test_the_capture_proxy_records_an_agents_calls(env: dict[str, str], tmp_path: Path) -> None:
    port = free_port()
    data_dir = tmp_path / "capture"
    command = [sys.executable, "-m", "tinker_cookbook.capture.proxy.serve", "--port", str(port)]
    command += ["--base-model", MODEL, "--store-data-dir", str(data_dir)]
    proxy = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proxy.poll() is None, proxy.communicate()[1][-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/r/run/agent-1/v1", api_key="unused")
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say you are 42."}], max_tokens=8
        )
        assert reply.usage is not None and reply.usage.completion_tokens > 0
    finally:
        proxy.send_signal(signal.SIGINT)
        proxy.wait(timeout=60)
        daemon = data_dir / "daemon.json"
        if daemon.is_file():  # the capture store's daemon is detached: stop it by its PID
            try:
                os.kill(json.loads(daemon.read_text())["pid"], signal.SIGTERM)
            except ProcessLookupError:
                pass
    with sqlite3.connect(data_dir / "capture.sqlite") as store:
        rows = store.execute("SELECT run_id, prompt_tokens, sampled_tokens FROM wire_rows").fetchall()
    assert len(rows) == 1 and rows[0][0] == "agent-1"
    assert json.loads(rows[0][1]) and json.loads(rows[0][2])
