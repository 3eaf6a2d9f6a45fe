"""Errors more than one part raises: a setting that is wrong, named in the message.

`ConfigError` lives below every part so the runner (agent specs, task sets) and the trainer (run
configs) refuse bad settings with the one error type the CLI turns into a one-line message.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value or key is wrong; the message names it."""
