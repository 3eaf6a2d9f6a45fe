"""Process-wide environment defaults that keep every agl_bridge process offline and quiet.

Applied when the package is imported, before LiteLLM or CrewAI can be imported by us, so that
LiteLLM does not fetch its cost map over the network and CrewAI sends no telemetry. Values the
user already set win.
"""

from __future__ import annotations

import os

OFFLINE_ENV_DEFAULTS: dict[str, str] = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_DISABLE_TRACKING": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "CREWAI_TESTING": "true",
    "TOKENIZERS_PARALLELISM": "false",
}


def apply_offline_env_defaults() -> None:
    """Set the offline/telemetry switches in this process (and so in its children) unless set."""
    for key, value in OFFLINE_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
