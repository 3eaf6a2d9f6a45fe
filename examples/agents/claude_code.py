"""Claude Code (`npm install -g @anthropic-ai/claude-code`) through agl-bridge: it speaks the
Anthropic Messages API (`/v1/messages`, streamed), so `ANTHROPIC_BASE_URL` is the rollout's base URL
without `/v1` (Anthropic's SDK adds it). Each turn of the task is one `claude -p` run; later turns
`--continue` the same session, so their prompts extend the first.

Run it as an `AgentCommand` (needs only Python's standard library and `claude` on PATH):
`OPENAI_BASE_URL` (routed to the rollout attempt), `OPENAI_API_KEY`, `AGL_MODEL`, and `AGL_TASK`
whose `turns` are the user messages of one conversation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

model = os.environ.get("AGL_MODEL", "tiny")
env = {
    **os.environ,
    "ANTHROPIC_BASE_URL": os.environ["OPENAI_BASE_URL"].removesuffix("/v1"),
    "ANTHROPIC_AUTH_TOKEN": os.environ["OPENAI_API_KEY"],  # sent as `Authorization: Bearer`
    # Every model Claude Code picks by itself (the main one, background "haiku" calls) is ours.
    "ANTHROPIC_MODEL": model,
    "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
    "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
    "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
    # A model id it does not know gets a 1M-token window: give it the served one (tiny's). It compacts ~33k
    # tokens before the end. CLAUDE_CODE_AUTO_COMPACT_WINDOW cannot say this: under 100k it reads as 100k.
    "CLAUDE_CODE_MAX_CONTEXT_TOKENS": "65536",
    # Nothing but model calls leaves the machine: no telemetry, error reports or update checks.
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
}
for number, turn in enumerate(json.loads(os.environ.get("AGL_TASK", "{}")).get("turns", ["Say hello."])):
    command = ["claude", "-p", turn, *(["--continue"] if number else [])]
    if (code := subprocess.run(command, env=env, stdin=subprocess.DEVNULL, check=False).returncode) != 0:
        sys.exit(code)
