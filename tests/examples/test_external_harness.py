"""Agents we do not launch: the hello agent as an outside harness trained by the follow trainer, a real
third-party agent (mini-swe-agent) driven over HTTP, and a follow trainer nobody calls."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from shared_helpers import AGL_BRIDGE, free_port

from agl_bridge.convert import ConversionReport, convert_store
from agl_bridge.store import SQLiteStore

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "external_harness"
AGENT_CACHE = Path(os.environ.get("AGL_AGENT_CACHE", ROOT / ".cache" / "agents"))
"""Where third-party agents are installed (kept between runs, so only the first run installs)."""

# The harness must never import agl_bridge: run it with the package made unimportable.
WITHOUT_AGL_BRIDGE = "import runpy, sys; sys.modules['agl_bridge'] = None; sys.argv = sys.argv[1:]; " \
    "runpy.run_path(sys.argv[0], run_name='__main__')"  # fmt: skip


def start(args: list[str], log: Path, **kwargs: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=ROOT, **kwargs)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def wait_for(path: Path, process: subprocess.Popen[bytes], log: Path, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, log.read_text()[-4000:]
        assert time.monotonic() < deadline, f"{path} did not appear: {log.read_text()[-4000:]}"
        time.sleep(0.5)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_follow_trainer_learns_the_hello_game_from_an_outside_harness(tmp_path: Path) -> None:
    """(a) The hello agent in its own process, plain openai + HTTP; the follow trainer serves and learns."""
    run_dir = tmp_path / "follow"
    steps = 60  # as the demo: the held-out reward rises by 0.3 in 20-60 steps
    trainer_log, harness_log = tmp_path / "trainer.log", tmp_path / "harness.log"
    trainer = start(
        [sys.executable, str(EXAMPLE / "train_follow.py"), "--run-dir", str(run_dir), "--port", "0",
         "--steps", str(steps), "--checkpoint-every", "10"],
        trainer_log,
    )  # fmt: skip
    harness = None
    try:
        wait_for(run_dir / "endpoint.json", trainer, trainer_log)
        harness = start(
            [sys.executable, "-c", WITHOUT_AGL_BRIDGE, str(EXAMPLE / "harness.py"),
             "--endpoint-file", str(run_dir / "endpoint.json"), "--eval-every", "10"],
            harness_log,
        )  # fmt: skip
        assert trainer.wait(1500) == 0, trainer_log.read_text()[-4000:]
        assert harness.wait(120) == 0, harness_log.read_text()[-4000:]
    finally:
        for process in (harness, trainer):
            if process is not None:
                stop(process)
    assert "the server went away" in harness_log.read_text()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["phase"] == "train"]
    evals = [r["eval_reward"] for r in records if r["phase"] == "eval"]
    assert [r["step"] for r in train] == list(range(1, steps + 1))
    assert all(r["follow"] and r["rollouts"] == 16 * 8 and r["staleness_max"] is not None for r in train if r["datums"])
    assert all(r["staleness_max"] <= 2 for r in train if r["staleness_max"] is not None)  # the config's max_staleness
    assert len(evals) >= 3, evals  # at the start, then every 10 rounds of the harness
    assert max(evals[1:]) >= evals[0] + 0.3, f"held-out reward did not rise: {evals}"
    assert (run_dir / "final_adapter" / "adapter_config.json").is_file()


def test_mini_swe_agent_driven_by_a_harness_lands_in_the_store_and_converts(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """(b) A real third-party agent program, unmodified, through `agl-bridge serve` and the lifecycle routes."""
    store, port, key = tmp_path / "serve.sqlite", free_port(), "sk-agl-mini-test"
    serve_log = tmp_path / "serve.log"
    server = start(
        [AGL_BRIDGE, "serve", "--model", str(tiny_model_dir), "--served-model-name", "tiny", "--store", str(store),
         "--port", str(port), "--api-key", key],
        serve_log,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while "recording into" not in serve_log.read_text():
            assert server.poll() is None and time.monotonic() < deadline, serve_log.read_text()[-3000:]
            time.sleep(0.5)
        harness = subprocess.run(
            [sys.executable, "-c", WITHOUT_AGL_BRIDGE, str(EXAMPLE / "mini_swe_agent.py"),
             "--base-url", f"http://127.0.0.1:{port}", "--api-key", key, "--task-id", "hello-file",
             "--cache", str(AGENT_CACHE)],
            cwd=ROOT, capture_output=True, text=True, timeout=1200, check=False,
        )  # fmt: skip
        if harness.returncode != 0 and "pip" in harness.stderr and not (AGENT_CACHE / "mini-swe-agent").exists():
            pytest.skip(f"mini-swe-agent could not be installed (no package registry?): {harness.stderr[-500:]}")
        assert harness.returncode == 0, harness.stderr[-4000:]
    finally:
        stop(server)
    answer = json.loads(harness.stdout.strip().splitlines()[-1])
    assert (answer["status"], answer["task_id"], answer["origin"]) == ("succeeded", "hello-file", "external")

    async def stored() -> tuple[Any, list[Any], list[Any], list[Any]]:
        async with SQLiteStore(store) as opened:
            rollout = await opened.get_rollout(answer["rollout_id"])
            calls = [c async for c in opened.iter_llm_calls(answer["rollout_id"], "0")]
            rewards = [r async for r in opened.iter_rewards(answer["rollout_id"], "0")]
            report = ConversionReport()
            trajectories = [t async for t in convert_store(opened, report=report)]
            return rollout, calls, rewards, trajectories

    rollout, calls, rewards, trajectories = asyncio.run(stored())
    assert rollout.group_id == "hello-file" and rollout.status.value == "succeeded"
    assert len(calls) >= 1 and all(c.kind == "token" and len(c.prompt_token_ids) > 500 for c in calls)
    assert [(r.name, r.value) for r in rewards] == [("hello_file", answer["reward"])]
    assert rewards[0].sequence > calls[-1].sequence  # reported after the agent's last call
    (trajectory,) = trajectories
    assert (trajectory.rollout_id, trajectory.group_id) == (answer["rollout_id"], "hello-file")
    assert sum(len(s.calls) for s in trajectory.segments) == len(calls)


def test_a_follow_trainer_nobody_calls_waits_says_so_and_never_spins(tmp_path: Path) -> None:
    run_dir = tmp_path / "idle"
    run_dir.mkdir()
    config = run_dir / "follow.json"
    config.write_text(
        json.dumps(
            {
                "mode": "follow",
                "model": "tiny",
                "run_dir": str(run_dir),
                "steps": 1,
                "tensorboard": False,
                "follow": {"port": 0, "wait_report_s": 1.0},
            }
        )
    )
    log = tmp_path / "trainer.log"
    trainer = start([AGL_BRIDGE, "train", "--config", str(config)], log, env={**os.environ, "COLUMNS": "300"})
    try:
        wait_for(run_dir / "endpoint.json", trainer, log)
        time.sleep(2.0)  # settle: the server has started
        cpu_before = cpu_seconds(trainer.pid)
        time.sleep(6.0)
        cpu_used = cpu_seconds(trainer.pid) - cpu_before
        assert trainer.poll() is None, log.read_text()[-3000:]
    finally:
        stop(trainer)
    text = log.read_text()
    waiting = [line for line in text.splitlines() if "waiting for rollouts at http://127.0.0.1:" in line]
    assert len(waiting) >= 3, text[-3000:]
    assert "0/8 groups of 4 for this step; 0 rollouts running, 0 finished in 0 incomplete groups" in waiting[-1]
    assert cpu_used < 1.5, f"a waiting trainer used {cpu_used:.2f} s of CPU in 6 s"


def test_a_follow_trainer_attached_to_a_running_serve_trains_its_rollouts_and_updates_its_weights(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Attach mode: `agl-bridge serve` records and serves; the trainer follows its store and loads new weights
    into it over `/v1/load_lora_adapter` (the serve's in-process sampler merges them live)."""
    store, port, key = tmp_path / "serve.sqlite", free_port(), "sk-agl-attach-test"
    base = f"http://127.0.0.1:{port}"
    serve_log, trainer_log = tmp_path / "serve.log", tmp_path / "trainer.log"
    server = start(
        [AGL_BRIDGE, "serve", "--model", str(tiny_model_dir), "--served-model-name", "tiny", "--store", str(store),
         "--port", str(port), "--api-key", key],
        serve_log,
    )  # fmt: skip
    trainer = None
    try:
        deadline = time.monotonic() + 240
        while "recording into" not in serve_log.read_text():
            assert server.poll() is None and time.monotonic() < deadline, serve_log.read_text()[-3000:]
            time.sleep(0.5)
        run_dir = tmp_path / "run"
        config = tmp_path / "attach.json"
        config.write_text(
            json.dumps(
                {
                    "mode": "follow",
                    "model": str(tiny_model_dir),
                    "run_dir": str(run_dir),
                    "steps": 1,
                    "batch_size": 1,
                    "group_size": 2,
                    "tensorboard": False,
                    "sampler": "remote",
                    "sampler_urls": [base],
                    "sampler_api_key": key,
                    "sampler_model": "tiny",
                    "follow": {"store": str(store), "wait_report_s": 1.0},
                }
            )
        )
        trainer = start(
            [AGL_BRIDGE, "train", "--config", str(config)], trainer_log, env={**os.environ, "COLUMNS": "300"}
        )
        deadline = time.monotonic() + 240
        while "following the store" not in trainer_log.read_text():
            assert trainer.poll() is None and time.monotonic() < deadline, trainer_log.read_text()[-3000:]
            time.sleep(0.5)
        http = httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=60)
        for index, reward in enumerate([1.0, 0.0]):
            prefix = f"{base}/rollout/attach-{index}/attempt/0"
            http.post(f"{prefix}/start", json={"task_id": "t"}).raise_for_status()
            body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            http.post(f"{prefix}/v1/chat/completions", json=body).raise_for_status()
            http.post(f"{prefix}/reward", json={"value": reward}).raise_for_status()
            http.post(f"{prefix}/finish", json={"status": "succeeded"}).raise_for_status()
        assert trainer.wait(300) == 0, trainer_log.read_text()[-4000:]
        after = http.post(
            f"{base}/rollout/attach-after/attempt/0/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        )
        assert after.status_code == 200
    finally:
        for process in (trainer, server):
            if process is not None:
                stop(process)
    (record,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert (record["step"], record["rollouts"], record["policy_version"]) == (1, 2, 1)

    async def versions() -> tuple[int | None, int | None]:
        async with SQLiteStore(store) as opened:
            before = [c async for c in opened.iter_llm_calls("attach-0", "0")]
            later = [c async for c in opened.iter_llm_calls("attach-after", "0")]
            return before[0].policy_version, later[0].policy_version

    assert asyncio.run(versions()) == (0, 1)  # the serve samples with the trainer's new weights
