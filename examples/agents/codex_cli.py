"""Codex CLI (`npm install -g @openai/codex`) through agl-bridge: it speaks only the Responses API
(`/v1/responses`, streamed), configured as a custom model provider. Each turn of the task is one
`codex exec` run; later turns `resume --last`, so their prompts extend the first. Codex sends no
output limit and treats a reply cut by the server's (`serve --default-max-tokens`, 1024 unless set)
as an error: serve with a limit its replies fit in.

The provider is given with `-c` overrides here; the same keys in `$CODEX_HOME/config.toml` work too
(see docs/agents.md). Run it as an `AgentCommand` (needs only Python's standard library and `codex`
on PATH): `OPENAI_BASE_URL` (routed to the rollout attempt), `OPENAI_API_KEY`, `AGL_MODEL`, and
`AGL_TASK` whose `turns` are the user messages of one conversation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

provider = (
    f'{{name="agl-bridge", base_url="{os.environ["OPENAI_BASE_URL"]}", env_key="OPENAI_API_KEY", wire_api="responses"}}'
)
settings = [
    f"model_providers.agl={provider}",
    "model_provider=agl",
    f"model={os.environ.get('AGL_MODEL', 'tiny')}",
    "model_context_window=65536",  # the served model's window (tiny's), so Codex compacts before it is full
    "check_for_update_on_startup=false",
    "analytics.enabled=false",
    "feedback.enabled=false",
]
overrides = [arg for setting in settings for arg in ("-c", setting)]
for number, turn in enumerate(json.loads(os.environ.get("AGL_TASK", "{}")).get("turns", ["Say hello."])):
    resume = ["resume", "--last"] if number else []
    command = ["codex", "exec", *overrides, "--skip-git-repo-check", *resume, turn]
    if (code := subprocess.run(command, stdin=subprocess.DEVNULL, check=False).returncode) != 0:
        sys.exit(code)
