"""LiteLLM hooks: trusting the gateway's key check, parsing chat requests once, recording text-only calls.

A user's LiteLLM config can route other models through the same endpoint (judges, frozen
answerers); their calls cannot be trained on, but they belong to the rollout's story and are kept
for export as text-only calls. Calls to our own provider are skipped there: the provider records
those itself, with token ids.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from litellm.constants import LITELLM_PROXY_MASTER_KEY_ALIAS
from litellm.integrations.custom_logger import CustomLogger
from litellm.proxy._types import LitellmUserRoles, UserAPIKeyAuth
from starlette.requests import Request

from agl_bridge.chat import ChatFormatError, normalize_messages, normalize_tools
from agl_bridge.proxy.errors import to_proxy_exception
from agl_bridge.proxy.gateway import admitted
from agl_bridge.proxy.provider import PROVIDER_NAME, AglProvider, attach_request
from agl_bridge.proxy.recording import CallRecorder
from agl_bridge.proxy.request import RequestError, route_of
from agl_bridge.proxy.service import check_response_format
from agl_bridge.types import Usage

logger = logging.getLogger(__name__)

GATEWAY_AUTH = f"{__name__}.admitted_by_gateway"
"""LiteLLM's `general_settings.custom_auth` value that makes its proxy trust the gateway's key check."""

_ADMIN = UserAPIKeyAuth(user_role=LitellmUserRoles.PROXY_ADMIN, api_key=LITELLM_PROXY_MASTER_KEY_ALIAS)


async def admitted_by_gateway(request: Request, api_key: str) -> UserAPIKeyAuth:
    """LiteLLM's key check, replaced: a request the gateway let in carried the key, so it is the admin.

    LiteLLM would otherwise check the master key again on every request (and answers 500 for a
    wrong one without its database). Its identity is the one LiteLLM gives the master key (with its
    alias, never the key); a request that did not pass the gateway is refused.
    """
    if not admitted(request.scope):
        message = "this request did not pass agl-bridge's gateway, which checks the key"
        raise to_proxy_exception(RequestError(message, code="invalid_api_key", status=401))
    from litellm.proxy.proxy_server import litellm_proxy_admin_name

    return _ADMIN.model_copy(update={"user_id": litellm_proxy_admin_name})


class ModelCheck(CustomLogger):
    """Refuses a request for a model the proxy does not serve with a 404 naming the `model` field; parses a
    chat request to a served model (a 400 naming the field) and hands the result to the provider.

    LiteLLM's own refusals are a 400 without `param` (unknown model) or, for messages that are not
    objects, a 400 carrying a LiteLLM traceback or a 500; this runs first, on the already parsed body.
    """

    def __init__(self, provider: AglProvider) -> None:
        super().__init__()
        self.provider = provider

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict, call_type: Any) -> dict:
        """Pass the request on if its model is served (and its chat input well formed), else raise."""
        from litellm.proxy import proxy_server

        model = data.get("model")
        router = proxy_server.llm_router
        if router is None or model is None:
            return data
        served = router.get_model_names()
        if model not in served:
            message = f"model {model!r} is not served here; served models: {', '.join(sorted(served))}"
            raise to_proxy_exception(RequestError(message, "model", code="model_not_found", status=404))
        try:
            check_response_format(data)  # for every model: LiteLLM's own parameter mapping answers it with a 500
            if call_type not in _CHAT_CALL_TYPES:
                return data
            service = self.provider.find(model)
            if service is not None:
                # A served name maps to our own entry `agl/<name>` alone (the config refuses clashes),
                # whose call parameters are the body's: parse it once, here, for the provider.
                attach_request(data, service.model_name, service.parse_request(data))
            elif "messages" in data and _is_ours(router, model):
                # An alias from the user's config may add call parameters; the provider parses the call.
                normalize_messages(data["messages"])
                normalize_tools(data.get("tools"))
        except ChatFormatError as error:
            raise to_proxy_exception(RequestError(str(error), error.param)) from None
        except RequestError as error:
            raise to_proxy_exception(error) from None
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
