"""Fixtures for the proxy tests: an `agl-bridge serve` subprocess started early.

The in-process server all other tests share is `proxy_server` (tests/conftest.py). The CLI test
needs a server of its own in a subprocess; loading torch, LiteLLM and the model there takes ~10 s
of CPU, so when that test is collected the subprocess is started with the first proxy test and
loads while the others run.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from proxy_helpers import ServeProcess
from shared_helpers import AGL_BRIDGE

from agl_bridge.testing.proxy_process import child_env


@pytest.fixture(scope="session")
def serve_process(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """`agl-bridge serve --model <tiny> --port 0 --store <tmp> --rollout-idle-timeout 1` in a subprocess; killed at
    session end if still up."""
    folder = tmp_path_factory.mktemp("cli_serve")
    store = folder / "cli.sqlite"
    process = subprocess.Popen(
        [AGL_BRIDGE, "serve", "--model", str(tiny_model_dir), "--port", "0", "--store", str(store)]
        + ["--rollout-idle-timeout", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
        cwd=folder,
    )
    server = ServeProcess(process, store, folder)
    assert process.stderr is not None
    threading.Thread(target=lambda: [server.lines.put(line) for line in process.stderr], daemon=True).start()
    try:
        yield server
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
        process.stderr.close()


@pytest.fixture(autouse=True)
def _start_serve_process_early(request: pytest.FixtureRequest) -> None:
    """Start `serve_process` with the first proxy test when a collected test will use it."""
    if any("serve_process" in getattr(item, "fixturenames", ()) for item in request.session.items):
        request.getfixturevalue("serve_process")
