"""agl_bridge: exact-token RL training data from unmodified agents, and a GRPO trainer for it."""

from __future__ import annotations

from agl_bridge._env import apply_offline_env_defaults
from agl_bridge._version import __version__

apply_offline_env_defaults()

# `emit_reward` is the one call users add to their agent. It is imported on first use so that
# `import agl_bridge` (e.g. by the sampler or the CLI) does not load OpenTelemetry.
_REWARDS = ("emit_reward", "emit_reward_async")
_LIFECYCLE = ("start_rollout", "finish_rollout")


def __getattr__(name: str) -> object:
    """`emit_reward`, `emit_reward_async`, `start_rollout`, `finish_rollout`: re-exported from `agl_bridge.tracing`."""
    if name in _REWARDS:
        from agl_bridge.tracing import rewards

        return getattr(rewards, name)
    if name in _LIFECYCLE:
        from agl_bridge.tracing import lifecycle

        return getattr(lifecycle, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["__version__", "emit_reward", "emit_reward_async", "finish_rollout", "start_rollout"]
