"""What a served request is: its rollout route, the validated chat request, the result, the refusal.

These types are shared by the chat service (which builds them), the recorder (which stores them),
the LiteLLM provider and the token routes (which carry them); they live here so that none of
those modules imports another just for a type. Nothing here knows LiteLLM or HTTP.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from agl_bridge import semconv
from agl_bridge.chat import AssistantMessage, PromptEncoding
from agl_bridge.proxy.streaming import FinalPiece
from agl_bridge.sampler.base import SampledSequence, SamplingParams
from agl_bridge.types import CallClass


class RequestError(ValueError):
    """A request we refuse; `agl_bridge.proxy.errors` shapes it for the wire with `status` (400 by default).

    `param` names the offending field the way OpenAI does, so users can fix the request without
    reading our code; `code` is a word such as "invalid_value".
    """

    def __init__(
        self, message: str, param: str | None = None, *, code: str | None = "invalid_value", status: int = 400
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status = status


def or_default(body: Mapping[str, Any], name: str, default: object) -> Any:
    """The field's value, or `default` when it is absent or null (OpenAI's spec makes every sampling field nullable)."""
    value = body.get(name)
    return default if value is None else value


def flag_field(body: Mapping[str, Any], name: str) -> bool:
    """A true/false request field (absent or null: false); a `RequestError` naming it for any other value.

    A truthy string such as "yes" is refused, not read as true: `ignore_eos: "x"` would otherwise
    ask for a sample as long as the context window.
    """
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise RequestError(f"{name} must be true or false, got {value!r:.100}", name)
    return bool(value)


@dataclass
class RequestTokens:
    """The tokens of the calls one request recorded (prompt once per call, every choice's sampled ids)."""

    prompt: int = 0
    completion: int = 0


REQUEST_TOKENS: ContextVar[RequestTokens | None] = ContextVar("agl_request_tokens", default=None)
"""Where the recorder counts the tokens of the request being served (set by the gateway when it logs requests)."""


@dataclass(frozen=True)
class RolloutRoute:
    """Which rollout attempt (and agent) a request belongs to, and what it declared about its call.

    The ids are all None outside rollouts. `call_class` and `parent_call` are the request's
    `x-agl-call-class` / `x-agl-parent-call` headers as sent (None when absent or blank): the class
    is checked by `declared_class` before anything is sampled, the parent resolved to a store
    sequence when the call is recorded (`agl_bridge.proxy.parent_call`).
    """

    rollout_id: str | None = None
    attempt_id: str | None = None
    agent_name: str | None = None
    call_class: str | None = None
    parent_call: str | None = None

    @property
    def cache_key(self) -> tuple[str, str | None] | None:
        """Key of the rollout's token cache (None: calls outside rollouts share no cache)."""
        return None if self.rollout_id is None else (self.rollout_id, self.attempt_id)


ROUTE_HEADERS = (
    semconv.HEADER_ROLLOUT_ID,
    semconv.HEADER_ATTEMPT_ID,
    semconv.HEADER_AGENT_NAME,
    semconv.HEADER_CALL_CLASS,
    semconv.HEADER_PARENT_CALL,
)
"""The request headers `route_of_headers` reads (lower-case)."""


def route_of_headers(headers: Mapping[str, str]) -> RolloutRoute:
    """The route named by request headers (lower-case names; the gateway has validated the ids)."""
    return RolloutRoute(
        rollout_id=headers.get(semconv.HEADER_ROLLOUT_ID) or None,
        attempt_id=headers.get(semconv.HEADER_ATTEMPT_ID) or None,
        agent_name=headers.get(semconv.HEADER_AGENT_NAME) or None,
        call_class=(headers.get(semconv.HEADER_CALL_CLASS) or "").strip() or None,
        parent_call=(headers.get(semconv.HEADER_PARENT_CALL) or "").strip() or None,
    )


_CALL_CLASSES = {member.value: member for member in CallClass}


def declared_class(route: RolloutRoute) -> CallClass | None:
    """The class the request declared for its call (header `x-agl-call-class`, any letter case), None when
    it declared none; a 400 `RequestError` naming the header and the allowed values for any other word."""
    if route.call_class is None:
        return None
    found = _CALL_CLASSES.get(route.call_class.lower())
    if found is None:
        raise RequestError(
            f"{semconv.HEADER_CALL_CLASS} must be one of {', '.join(semconv.CALL_CLASSES)}, got "
            f"{route.call_class!r:.100}; leave the header out to let the converter infer the call's class",
            semconv.HEADER_CALL_CLASS,
        )
    return found


def route_of(litellm_params: Mapping[str, Any] | None) -> RolloutRoute:
    """The route of a call LiteLLM's proxy hands on, from the request headers it keeps in `litellm_params`."""
    params = litellm_params or {}
    metadata = params.get("metadata") or {}
    headers = metadata.get("headers") or (params.get("proxy_server_request") or {}).get("headers") or {}
    return route_of_headers(headers)


@dataclass
class ChatRequest:
    """A validated chat completion request; `messages` and `tools` are normalised (`agl_bridge.chat`)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    parse_tool_calls: bool
    n: int
    params: SamplingParams
    stop_strings: tuple[str, ...]
    logprobs: bool
    top_logprobs: int
    return_token_ids: bool
    chat_template_kwargs: dict[str, Any] | None
    text_chars: int = 0
    """About how many characters of text the messages and tools hold (decides where they are encoded)."""


@dataclass
class ChoiceResult:
    """One sampled choice: the assistant message and the exact sequence behind it."""

    index: int
    message: AssistantMessage
    sequence: SampledSequence
    top_logprobs: list[list[tuple[int, float]]] | None = None


@dataclass
class ChatResult:
    """A finished chat completion: prompt ids, choices, and the store sequence of each choice."""

    prompt_token_ids: list[int]
    choices: list[ChoiceResult]
    prompt: PromptEncoding
    sequences: list[int] = field(default_factory=list)
    final_pieces: list[FinalPiece] = field(default_factory=list)

    @property
    def completion_tokens(self) -> int:
        """Tokens sampled over all choices."""
        return sum(len(c.sequence.tokens) for c in self.choices)
