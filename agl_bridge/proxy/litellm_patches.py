"""Every work-around for a LiteLLM (1.106.2) bug or gap, in this one module.

The proxy app: LiteLLM iterates `tools` and `functions` before any validation — its auth layer for the tool
allow-list, its logging for built-in tool cost tracking — so a body with `"tools": 1` or
`"tools": true` raises TypeError there and the client gets a 500. Such a body is a client error:
with those two places made tolerant, the request reaches our own check, which answers 400 naming
`tools`.

FastAPI resolves the routes of LiteLLM's large app lazily, on the first request that reaches it
(`resolve_routes`).

The request translations the front door calls (`bridge_route`) crash on some malformed bodies
(`translation_refused`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agl_bridge.proxy.request import RequestError

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


# ------------------------------------------------------------------ LiteLLM's request translations (bridge_route)


@contextmanager
def translation_refused(protocol: str) -> Iterator[None]:
    """Turn a LiteLLM translation's crash on a body it cannot take into a 400 (`RequestError`).

    LiteLLM's translators trust the body's shape; `bridge_checks` refuses the malformed shapes known
    to crash them, naming the field, and this catches the rest.
    """
    from pydantic import ValidationError

    try:
        yield
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, ValidationError) as error:
        message = f"the {protocol} request could not be translated to a chat request: {error}"
        raise RequestError(message[:500], code="invalid_value") from None


def resolve_routes(app: Any) -> None:
    """Have FastAPI resolve the routes of LiteLLM's app now (the server calls it before it reports ready).

    FastAPI (0.16x) resolves an app's included routers lazily, on the first request that reaches
    them; for LiteLLM's hundreds of routes that takes about 1 s of CPU (3 s on a busy machine), which
    the first request LiteLLM serves would wait for (a client's `GET /v1/models`, say). Matching a
    path no route has resolves them all.
    """
    probe = {"type": "http", "path": "/agl-bridge/resolve-routes", "method": "GET", "headers": [], "root_path": ""}
    for route in app.router.routes:
        route.matches(probe)
