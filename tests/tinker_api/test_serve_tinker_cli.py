"""`agl-bridge serve-tinker` as a user starts it: it prints where it listens and the key, the SDK reaches it with
the recipe's model name mapped to the tiny model, and bad flags are refused with a message naming them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import tinker
from typer.testing import CliRunner

from agl_bridge.cli import app

CLI = [sys.executable, "-m", "agl_bridge"]


def _env() -> dict[str, str]:
    return {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1", "TINKER_TELEMETRY": "0"}


@pytest.mark.slow
def test_the_command_serves_the_sdk_and_stops_on_sigint(tmp_path: Path) -> None:
    command = [*CLI, "serve-tinker", "--port", "0", "--model", "Qwen/Qwen3-8B=tiny", "--root", str(tmp_path)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        assert process.stderr is not None
        lines = [process.stderr.readline() for _ in range(2)]
        url = re.search(r"TINKER_BASE_URL=(\S+) TINKER_API_KEY=(\S+)", lines[1])
        assert url, lines
        capabilities = tinker.RestClient(base_url=url[1], api_key=url[2]).get_server_capabilities().result()
        assert [m.model_name for m in capabilities.supported_models] == ["Qwen/Qwen3-8B"]
        with tinker.ServiceClient(base_url=url[1], api_key=url[2]) as service:
            training = service.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=4).result()
            path = training.save_state("first").result().path
        assert (tmp_path / training.model_id / "weights" / "first").is_dir(), path
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--model", "Qwen/Qwen3-8B"], "expected NAME=PATH"),
        (["--api-key", "sk-not-tinker"], "start with 'tml-'"),
        (["--host", "0.0.0.0"], "without --api-key"),
    ],
)
def test_bad_flags_are_refused_by_name(flags: list[str], message: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["serve-tinker", "--port", "0", "--root", str(tmp_path), *flags])
    assert result.exit_code == 2 and message in result.output, result.output
