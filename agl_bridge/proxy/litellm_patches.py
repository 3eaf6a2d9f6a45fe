"""Work-arounds for LiteLLM proxy bugs that turn a malformed request into a 500.

LiteLLM iterates `tools` and `functions` before any validation — its auth layer for the tool
allow-list, its logging for built-in tool cost tracking — so a body with `"tools": 1` or
`"tools": true` raises TypeError there and the client gets a 500. Such a body is a client error:
with those two places made tolerant, the request reaches our own check, which answers 400 naming
`tools`.
"""

from __future__ import annotations

import functools
from typing import Any

_PATCHED_MODULES = (
    "litellm.proxy.auth.auth_checks",
    "litellm.proxy.guardrails.guardrail_hooks.tool_policy.tool_policy_guardrail",
)


def patch_litellm() -> None:
    """Apply the work-arounds (idempotent)."""
    import importlib

    from litellm.proxy.guardrails import tool_name_extraction

    original = tool_name_extraction.extract_request_tool_names
    if getattr(original, "_agl_patched", False):
        return

    @functools.wraps(original)
    def tolerant(route: Any, data: Any) -> list[str]:
        if isinstance(data, dict) and any(
            data.get(key) and not isinstance(data.get(key), list) for key in ("tools", "functions")
        ):
            return []  # malformed: left for the request validation to refuse with a 400
        return original(route, data)

    tolerant._agl_patched = True  # type: ignore[attr-defined]
    _patch_built_in_tools_params()
    tool_name_extraction.extract_request_tool_names = tolerant
    for name in _PATCHED_MODULES:
        module = importlib.import_module(name)
        if getattr(module, "extract_request_tool_names", None) is original:
            # Monkeypatching the name each module imported: ModuleType declares no such attribute.
            module.extract_request_tool_names = tolerant  # type: ignore[attr-defined]


def _patch_built_in_tools_params() -> None:
    from litellm.litellm_core_utils.litellm_logging import Logging
    from litellm.types.utils import StandardBuiltInToolsParams

    original = Logging.initialize_standard_built_in_tools_params

    @functools.wraps(original)
    def tolerant(self: Any, kwargs: dict | None = None) -> Any:
        try:
            return original(self, kwargs)
        except (TypeError, AttributeError):  # malformed tools: nothing to track, refused later with a 400
            return StandardBuiltInToolsParams(web_search_options=None, file_search=None)

    Logging.initialize_standard_built_in_tools_params = tolerant  # type: ignore[method-assign]
