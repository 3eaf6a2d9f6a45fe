"""mini-swe-agent (`pip install mini-swe-agent`) through agl-bridge: its `LitellmModel` on the proxy
(LiteLLM's `openai/` route, the bash tool as an OpenAI tool call) driving the `DefaultAgent` with
the package's default prompts, commands run in the working directory.

The agent's loop is the conversation: every step (and every reply it cannot parse) adds to the
messages of the next, so each prompt extends the last. The task is the first of `AGL_TASK`'s
`turns`. Offline it needs `MSWEA_COST_TRACKING=ignore_errors` (LiteLLM has no price for our model)
and `LITELLM_LOCAL_MODEL_COST_MAP=True`, set below unless the caller set them. Run it as an
`AgentCommand`: `OPENAI_BASE_URL` (routed to the rollout attempt), `OPENAI_API_KEY`, `AGL_MODEL`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

for name, value in {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "MSWEA_COST_TRACKING": "ignore_errors",
    "MSWEA_SILENT_STARTUP": "1",
}.items():
    os.environ.setdefault(name, value)  # read when the packages are imported

import yaml  # noqa: E402
from minisweagent import package_dir  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from minisweagent.models.litellm_model import LitellmModel  # noqa: E402

model = LitellmModel(
    model_name="openai/" + os.environ.get("AGL_MODEL", "tiny"),
    model_kwargs={"api_base": os.environ["OPENAI_BASE_URL"], "api_key": os.environ["OPENAI_API_KEY"]},
)
config = yaml.safe_load(Path(package_dir, "config", "default.yaml").read_text())["agent"]
agent = DefaultAgent(model, LocalEnvironment(), **{**config, "step_limit": 4})
task = json.loads(os.environ.get("AGL_TASK", "{}")).get("turns", ["Say hello."])[0]
print(agent.run(task))
