"""opencode (`npm install -g opencode-ai`) through agl-bridge: an OpenAI-compatible provider
(`@ai-sdk/openai-compatible`, streamed chat completions) given inline in `OPENCODE_CONFIG_CONTENT`.
Each turn of the task is one `opencode run`; later turns `--continue` the session, so their
prompts extend the first.

Run it as an `AgentCommand` (needs only Python's standard library and `opencode` on PATH):
`OPENAI_BASE_URL` (routed to the rollout attempt), `OPENAI_API_KEY`, `AGL_MODEL`, and `AGL_TASK`
whose `turns` are the user messages of one conversation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

model = os.environ.get("AGL_MODEL", "tiny")
config = {
    "$schema": "https://opencode.ai/config.json",
    "model": f"agl/{model}",
    "autoupdate": False,
    "share": "disabled",
    "provider": {
        "agl": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "agl-bridge",
            "options": {"baseURL": os.environ["OPENAI_BASE_URL"], "apiKey": "{env:OPENAI_API_KEY}"},
            # opencode compacts the conversation when it nears `context`: give it the served window.
            "models": {model: {"name": model, "limit": {"context": 65536, "output": 4096}}},
        }
    },
}
env = {
    **os.environ,
    "OPENCODE_CONFIG_CONTENT": json.dumps(config),
    # No model catalogue download, update check, default plugins or language-server downloads.
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
}
for number, turn in enumerate(json.loads(os.environ.get("AGL_TASK", "{}")).get("turns", ["Say hello."])):
    command = ["opencode", "run", *(["--continue"] if number else []), turn]
    if (code := subprocess.run(command, env=env, stdin=subprocess.DEVNULL, check=False).returncode) != 0:
        sys.exit(code)
