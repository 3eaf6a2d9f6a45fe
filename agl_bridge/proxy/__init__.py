"""The LiteLLM proxy over a token sampler: serving, rollout routing, and exact recording.

LiteLLM logs a full traceback at ERROR level for every refused request; those are the client's
mistakes, answered with a clear 4xx, so the proxy keeps LiteLLM's own log to critical messages
unless the user set LITELLM_LOG. This must happen before LiteLLM is imported.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOG", "CRITICAL")
