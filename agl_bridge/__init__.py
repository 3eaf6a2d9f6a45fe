"""agl_bridge: exact-token RL training data from unmodified agents, and a GRPO trainer for it."""

from __future__ import annotations

from agl_bridge._env import apply_offline_env_defaults

apply_offline_env_defaults()

__version__ = "0.1.0"
