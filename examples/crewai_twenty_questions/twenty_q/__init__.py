"""Twenty Questions on CrewAI, trained through agl_bridge without changing the agent's code.

Importing this package first sets the offline switches (CrewAI telemetry and tracing off, LiteLLM's
local cost map) before CrewAI or LiteLLM are imported anywhere; see `env`.
"""

from __future__ import annotations

from twenty_q.env import apply_offline_environment

apply_offline_environment()
