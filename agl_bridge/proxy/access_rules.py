"""Which routes each key reaches: the explicit lists the front door (`gateway`) checks every request against.

Two kinds of key (`agl_bridge.agent_keys`):
- the operator key (`agl-bridge serve --api-key`): every route of ours (lifecycle, LoRA, stored
  responses, token completions, the OTLP receiver) and LiteLLM's inference routes for every model.
  LiteLLM's other routes — management (`/key/*`, `/user/*`, `/team/*`, `/model/*`, `/config/*`),
  debug, SSO, spend, `/routes`, and `/health` (which calls every upstream model) — are closed for
  every key unless the operator opens them (`--litellm-admin-routes`): they leak other models'
  addresses and keys, cost money, or fail with 500s for want of LiteLLM's database.
- an agent key: only `AGENT_ROUTES` (model routes and the OTLP receiver), under its own rollout
  attempt. Everything else is 404 for it, whatever the operator opened.
"""

from __future__ import annotations

_API_BASES = ("/v1", "")

_MODEL_CALLS = ("/chat/completions", "/completions", "/responses", "/messages", "/messages/count_tokens")

AGENT_ROUTES: frozenset[tuple[str, str]] = frozenset(
    {("POST", base + call) for base in _API_BASES for call in _MODEL_CALLS}
    | {("GET", base + "/models") for base in _API_BASES}
    | {("POST", "/v1/traces")}
)
"""(method, path) an agent key may call: its model (chat, completions, Responses, Anthropic Messages,
count_tokens, the model list) and the OTLP receiver (spans of its own attempt, no rewards)."""

AGENT_ROUTE_PREFIXES: tuple[tuple[str, str], ...] = tuple(
    ("GET", base + prefix) for base in _API_BASES for prefix in ("/models/", "/responses/")
)
"""(method, path prefix) an agent key may call: one model's card, and a stored response of its own rollout."""

LITELLM_INFERENCE_PATHS: frozenset[str] = frozenset(
    base + call
    for base in (*_API_BASES, "/openai/v1")
    for call in (
        *_MODEL_CALLS,
        "/embeddings",
        "/models",
        "/moderations",
        "/images/generations",
        "/images/edits",
        "/audio/speech",
        "/audio/transcriptions",
        "/audio/translations",
        "/rerank",
    )
) | {"/v1/traces"}
"""LiteLLM's paths that call a model (the user's other models: judges, answerers) and the OTLP receiver:
open to the operator key whatever the admin setting."""

LITELLM_INFERENCE_PREFIXES: tuple[str, ...] = (
    "/v1/models/",
    "/models/",
    "/v1/responses/",
    "/responses/",
    "/openai/deployments/",
    "/engines/",
)
"""Path prefixes of LiteLLM's per-model inference routes (Azure- and engine-style clients, one model's card)."""


def agent_may_call(method: str, path: str) -> bool:
    """Whether an agent key may call `method path` (the path without the rollout prefix)."""
    if "//" in path or "/." in path or "\\" in path:
        return False  # no route of its own has such a segment; refuse rather than trust every router to agree
    if (method, path) in AGENT_ROUTES:
        return True
    return any(method == allowed and path.startswith(prefix) for allowed, prefix in AGENT_ROUTE_PREFIXES)


def litellm_inference(path: str) -> bool:
    """Whether `path` is one of LiteLLM's inference routes (open to the operator key without the admin flag)."""
    return path in LITELLM_INFERENCE_PATHS or path.startswith(LITELLM_INFERENCE_PREFIXES)
