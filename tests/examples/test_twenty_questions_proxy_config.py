"""The answerer routed through the proxy's LiteLLM config: a model by configuration, recorded text-only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
CONFIG = """\
model_list:
  - model_name: scripted-player
    litellm_params:
      model: openai/scripted-player
      api_key: unused
      mock_response: "Thought: broad first\\nFinal Answer: Is it an animal?"
  - model_name: answerer
    litellm_params:
      model: openai/answerer
      api_key: unused
      mock_response: '{"brief_reason": "It is one.", "yes_or_no": "yes", "correct": false}'
"""


def test_answerer_via_the_proxy_config_is_used_and_recorded_as_text(tmp_path: Path) -> None:
    config = tmp_path / "litellm.yaml"
    config.write_text(CONFIG)
    result = subprocess.run(
        [sys.executable, str(HERE / "twenty_questions_proxy_driver.py"), str(tmp_path / "store.sqlite"), str(config)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": str(HERE),
            "TWENTYQ_ANSWERER_MODEL": "answerer",
            "TWENTYQ_ANSWERER_VIA_PROXY": "1",
            "TWENTYQ_MAX_TURNS": "2",
        },
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["status"] == "succeeded", report["error"]
    state = report["state"]
    assert [(t["question"], t["answer"], t["reason"]) for t in state["history"]] == [
        ("Is it an animal?", "yes", "It is one."),
        ("Is it an animal?", "yes", "It is one."),
    ]
    assert state["answerer_errors"] == 0 and not state["guessed"]
    # Both models were served by the user's config through the rollout's URL: recorded text-only, in order.
    assert report["calls"] == [["text", "scripted-player"], ["text", "answerer"]] * 2
