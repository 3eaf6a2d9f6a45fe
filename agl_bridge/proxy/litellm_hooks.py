"""LiteLLM callbacks: refusing unknown models clearly, and recording text-only calls.

A user's LiteLLM config can route other models through the same endpoint (judges, frozen
answerers); their calls cannot be trained on, but they belong to the rollout's story and are kept
for export as text-only calls. Calls to our own provider are skipped there: the provider records
those itself, with token ids.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

from agl_bridge.chat import ChatFormatError, normalize_messages, normalize_tools
from agl_bridge.proxy.provider import PROVIDER_NAME, route_of
from agl_bridge.proxy.recording import CallRecorder
from agl_bridge.types import Usage

logger = logging.getLogger(__name__)


class ModelCheck(CustomLogger):
    """Refuses a request for a model the proxy does not serve with a 404 naming the `model` field,
    and malformed `messages` / `tools` of a chat request to our own models with a 400 naming the field.

    LiteLLM's own refusals are a 400 without `param` (unknown model) or, for messages that are not
    objects, a 400 carrying a LiteLLM traceback or a 500; this runs first, on the already parsed body.
    """

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict, call_type: Any) -> dict:
        """Pass the request on unchanged if its model is served (and its chat input well formed), else raise."""
        from litellm.proxy import proxy_server
        from litellm.proxy._types import ProxyException

        model = data.get("model")
        router = proxy_server.llm_router
        if router is None or model is None:
            return data
        served = router.get_model_names()
        if model not in served:
            raise ProxyException(
                message=f"model {model!r} is not served here; served models: {', '.join(sorted(served))}",
                type="invalid_request_error",
                param="model",
                code=404,
                openai_code="model_not_found",
            )
        response_format = data.get("response_format")
        if response_format is not None and not (
            isinstance(response_format, dict) and isinstance(response_format.get("type"), str)
        ):
            # LiteLLM's own parameter mapping raises on it and answers 500
            raise ProxyException(
                message=f'response_format must be an object like {{"type": "json_object"}}, got '
                f"{response_format!r:.100}",
                type="invalid_request_error",
                param="response_format",
                code=400,
                openai_code="invalid_value",
            )
        if call_type in _CHAT_CALL_TYPES and "messages" in data and _is_ours(router, model):
            try:
                normalize_messages(data["messages"])
                normalize_tools(data.get("tools"))
            except ChatFormatError as error:
                raise ProxyException(
                    message=str(error), type="invalid_request_error", param=error.param, code=400
                ) from None
        return data


_CHAT_CALL_TYPES = ("acompletion", "completion")


def _is_ours(router: Any, model: str) -> bool:
    """Whether `model` is served by agl_bridge's provider (not a model from the user's LiteLLM config)."""
    deployments = router.get_model_list(model_name=model) or []
    return any(
        str((d.get("litellm_params") or {}).get("model", "")).startswith(f"{PROVIDER_NAME}/") for d in deployments
    )


class TextCallLogger(CustomLogger):
    """A LiteLLM success callback that stores text-only calls in the rollout they belong to."""

    def __init__(self, recorder: CallRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    async def async_log_success_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        """Store the call unless our own provider served (and recorded) it."""
        litellm_params = kwargs.get("litellm_params") or {}
        if (kwargs.get("custom_llm_provider") or litellm_params.get("custom_llm_provider")) == PROVIDER_NAME:
            return
        try:
            choice = response_obj.choices[0]
            usage = getattr(response_obj, "usage", None)
            await self.recorder.record_text_call(
                route_of(litellm_params),
                model=str(kwargs.get("model")),
                messages=list(kwargs.get("messages") or []),
                response_text=getattr(choice.message, "content", None),
                finish_reason=getattr(choice, "finish_reason", None),
                started=_seconds(start_time),
                ended=_seconds(end_time),
                usage=Usage(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens) if usage else None,
            )
        except Exception:  # a logging failure must not fail the user's request; it is reported
            logger.exception("could not record a text-only call to %s", kwargs.get("model"))


def _seconds(value: Any) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    return float(value) if isinstance(value, (int, float)) else None
