"""A training process writes its store through one connection: the trainer uses the proxy's store.

Two connections to one SQLite file in one process (the in-process proxy's and the trainer's own)
contend for the file's write lock; on a loaded machine one waited past SQLite's busy timeout and
the run failed with "database is locked". Counted here: the writer connections a run opens.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_follow_loop import config, harness_group

from agl_bridge.primitives import TrainingClient
from agl_bridge.store import SQLiteStore, sqlite_writer
from agl_bridge.train.follow import FollowLoop
from agl_bridge.train.run_log import RunLog

COUNTING_RUN = """
import collections, json, os, runpy, sys
from agl_bridge.store import sqlite_writer

opened = collections.Counter()
connect = sqlite_writer.SQLiteWriter.connect


def counting(self):
    opened[os.path.realpath(self.path)] += 1
    connect(self)


sqlite_writer.SQLiteWriter.connect = counting
sys.argv = ["agl-bridge", "train", "--config", sys.argv[1]]
try:
    runpy.run_module("agl_bridge.cli", run_name="__main__")
except SystemExit as exit:
    assert not exit.code, exit.code
print("WRITERS " + json.dumps(opened))
"""

TOY_AGENT = """
from agl_bridge import emit_reward


def toy_agent(task, endpoint):
    client = endpoint.openai_client()
    reply = client.chat.completions.create(
        model=endpoint.model, messages=[{"role": "user", "content": f"Say {task}."}], max_tokens=4
    )
    emit_reward(len(reply.choices[0].message.content or "") / 10)
"""


@pytest.fixture
def count_writers(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Writer connections opened from now on, by store file."""
    opened: Counter[str] = Counter()
    connect = sqlite_writer.SQLiteWriter.connect

    def counting(self: sqlite_writer.SQLiteWriter) -> None:
        opened[os.path.realpath(self.path)] += 1
        connect(self)

    monkeypatch.setattr(sqlite_writer.SQLiteWriter, "connect", counting)
    return opened


@pytest.fixture
def store_on_its_own_loop(tmp_path: Path) -> Iterator[SQLiteStore]:
    """The store as the proxy holds it: opened on a loop running in another thread."""
    ready, box = threading.Event(), {}

    def serve() -> None:
        async def main() -> None:
            async with SQLiteStore(tmp_path / "run" / "store.sqlite") as store:
                box["store"], box["loop"], box["stop"] = store, asyncio.get_running_loop(), asyncio.Event()
                ready.set()
                await box["stop"].wait()

        asyncio.run(main())

    thread = threading.Thread(target=serve)
    thread.start()
    assert ready.wait(30)
    yield box["store"]
    box["loop"].call_soon_threadsafe(box["stop"].set)
    thread.join(30)


def test_the_follow_loop_uses_the_store_it_is_given(
    tmp_path: Path,
    make_client: Callable[..., TrainingClient],
    store_on_its_own_loop: SQLiteStore,
    count_writers: Counter[str],
) -> None:
    run_dir, store_path = tmp_path / "run", tmp_path / "run" / "store.sqlite"
    asyncio.run(harness_group(store_path, "a", [1.0, 0.0]))
    count_writers.clear()  # the harness's writes above are another process's, in production
    log = RunLog(run_dir, tensorboard=False)
    loop = FollowLoop(
        config(run_dir, steps=1), make_client(), store_path, log, where="test", store=store_on_its_own_loop
    )
    summary = asyncio.run(loop.run({"next_step": 0, "since": 0.0, "eval_start": None}, 0))
    log.close()
    assert summary.steps == 1
    assert count_writers == {}, "the follow loop opened a writer of its own beside the proxy's"


@pytest.mark.slow
def test_an_online_run_opens_one_writer_on_its_store(tmp_path: Path) -> None:
    (tmp_path / "toy_agent.py").write_text(TOY_AGENT)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in ["cats", "dogs"]))
    settings: dict[str, Any] = {
        "agent": f"{tmp_path / 'toy_agent.py'}:toy_agent",
        "tasks": str(tmp_path / "tasks.jsonl"),
        "eval_tasks": str(tmp_path / "tasks.jsonl"),
        "run_dir": str(tmp_path / "run"),
        "steps": 1,
        "batch_size": 2,
        "group_size": 2,
        "default_max_tokens": 4,
        "tensorboard": False,
    }
    (tmp_path / "run.json").write_text(json.dumps(settings))
    command = [sys.executable, "-c", COUNTING_RUN, str(tmp_path / "run.json")]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("WRITERS ")]
    writers = json.loads(line.removeprefix("WRITERS "))
    assert writers == {os.path.realpath(tmp_path / "run" / "store.sqlite"): 1}
