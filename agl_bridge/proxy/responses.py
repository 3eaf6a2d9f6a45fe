"""The Responses API's ids and stored responses, answered from the rollout's own records.

A served call's chat completion id (`call_id`) is `chatcmpl-agl-` + the call's rollout, attempt and
start time sealed under a secret of the server (`use_id_secret`; `ProxyServer` derives it from the
operator key): encrypted, so an id shows neither the rollout nor the time, and authenticated, so
no id can be made up or altered. That is how its `LLMCall` is found again in the store
(`find_call`) — no state besides the store, so ids stay valid across restarts and proxies with the
same operator key. A stored response resolves only within the rollout that made it: a request
routed to another rollout (an agent key always is) gets the 404 an unknown id gets. Its Responses
id (`response_id`) wraps that id in LiteLLM's managed-response format, as LiteLLM's bridge wrote it. On that:
- `previous_response_id` (`resolve_previous_response`, called by the bridge route before it serves
  the request): the stored call's prompt messages and its response become the history the new input
  continues (`PriorTurns`, put in front of the translated messages, so the rollout's token cache
  keeps the prompt an exact extension of the last one); an id that names no stored call is a 404
  naming `previous_response_id`. LiteLLM's own resolution needs its database.
- `GET /v1/responses/{id}` answers the stored call as a Responses object (`responses_wire`, as it was
  answered); `DELETE`, `/cancel` and `/input_items` are refused with 501 for a stored response
  (records are training data; nothing runs in the background), 404 otherwise.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from litellm.responses.utils import ResponsesAPIRequestUtils

from agl_bridge.chat import AssistantMessage, ChatCodec
from agl_bridge.proxy.request import RequestError, RolloutRoute, route_of_headers
from agl_bridge.proxy.responses_wire import ResponsesWriter
from agl_bridge.store.base import Store
from agl_bridge.types import LLMCall

_PREFIX = "chatcmpl-agl-"
RESPONSE_PATH_PREFIXES = ("/v1/responses/", "/responses/")
"""Paths under which stored responses are addressed (answered by `make_responses_router`'s routes)."""


@dataclass(frozen=True)
class CallKey:
    """What finds a served call in the store: its rollout attempt and its exact start time."""

    rollout_id: str | None
    attempt_id: str | None
    started: float


class _Clock:
    """Start times unique within the process (a call's key), never behind the wall clock by more than µs."""

    def __init__(self) -> None:
        self._last = 0.0

    def __call__(self) -> float:
        now = max(time.time(), self._last + 1e-6)
        self._last = now
        return now


unique_start: Callable[[], float] = _Clock()
"""The start time of a call the provider serves: unique within the process, so it names the call."""


class IdSeal:
    """Encrypt-then-MAC for call ids: an HMAC-SHA256 keystream (counter mode over a random nonce) and a tag.

    Stateless, keyed by one secret; tokens carry nothing readable and cannot be forged or altered.
    """

    _NONCE = 12
    _TAG = 16

    def __init__(self, secret: bytes) -> None:
        self._encrypt = hmac.new(secret, b"agl call ids: encrypt", hashlib.sha256).digest()
        self._authenticate = hmac.new(secret, b"agl call ids: authenticate", hashlib.sha256).digest()

    def seal(self, plain: bytes) -> str:
        """`plain` sealed, as base64url text."""
        nonce = secrets.token_bytes(self._NONCE)
        cipher = bytes(a ^ b for a, b in zip(plain, self._stream(nonce, len(plain)), strict=True))
        tag = hmac.new(self._authenticate, nonce + cipher, hashlib.sha256).digest()[: self._TAG]
        return base64.urlsafe_b64encode(nonce + cipher + tag).decode().rstrip("=")

    def open(self, text: str) -> bytes | None:
        """What `seal` sealed into `text`, or None for text it did not make (or altered)."""
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except ValueError:
            return None
        if len(raw) < self._NONCE + self._TAG:
            return None
        nonce, cipher, tag = raw[: self._NONCE], raw[self._NONCE : -self._TAG], raw[-self._TAG :]
        expected = hmac.new(self._authenticate, nonce + cipher, hashlib.sha256).digest()[: self._TAG]
        if not hmac.compare_digest(expected, tag):
            return None
        return bytes(a ^ b for a, b in zip(cipher, self._stream(nonce, len(cipher)), strict=True))

    def _stream(self, nonce: bytes, size: int) -> bytes:
        blocks = (size + 31) // 32
        stream = b"".join(
            hmac.new(self._encrypt, nonce + i.to_bytes(4, "big"), hashlib.sha256).digest() for i in range(blocks)
        )
        return stream[:size]


_seal = IdSeal(secrets.token_bytes(32))


def use_id_secret(secret: bytes) -> None:
    """Seal and open call ids under `secret` from now on (the server's, derived from its operator key); until
    then a random secret of the process is used. Ids sealed under another secret stop resolving."""
    global _seal
    _seal = IdSeal(secret)


def call_id(route: RolloutRoute, started: float) -> str:
    """The chat completion id of a call served for `route` that started at `started` (sealed: opaque)."""
    payload = json.dumps([route.rollout_id, route.attempt_id, started.hex()], separators=(",", ":"))
    return _PREFIX + _seal.seal(payload.encode())


def response_id(chat_id: str, provider: str) -> str:
    """The Responses id of the call `chat_id` names, served by LiteLLM provider `provider`: LiteLLM's
    managed-response id (`resp_` + base64 of `litellm:custom_llm_provider:…;model_id:None;response_id:…`),
    which its bridge gave before, so ids handed out then still name their calls (`key_of` reads both)."""
    managed = f"litellm:custom_llm_provider:{provider};model_id:None;response_id:{chat_id}"
    return "resp_" + base64.b64encode(managed.encode()).decode()


def key_of(response_id: str) -> CallKey | None:
    """The call a Responses id (LiteLLM's, wrapping `call_id`) or a chat completion id names; None if none."""
    inner = ResponsesAPIRequestUtils.decode_responses_api_response_id(response_id).get("response_id") or ""
    if not inner.startswith(_PREFIX):
        return None
    plain = _seal.open(inner[len(_PREFIX) :])
    if plain is None:
        return None
    try:
        rollout, attempt, started = json.loads(plain)
        key = CallKey(rollout, attempt, float.fromhex(started))
    except (ValueError, TypeError):
        return None
    if not all(isinstance(x, str | None) for x in (key.rollout_id, key.attempt_id)):
        return None
    return key


def within(key: CallKey | None, route: RolloutRoute | None) -> CallKey | None:
    """`key` if a request routed to `route` may resolve it (same rollout, or a request outside rollouts, which
    only the operator key can make), else None: another rollout's records are as unknown as a made-up id."""
    if key is None or route is None or route.rollout_id is None or route.rollout_id == key.rollout_id:
        return key
    return None


async def find_call(store: Store, key: CallKey) -> LLMCall | None:
    """The stored call `key` names (its first choice), or None."""
    if key.rollout_id is None:
        calls = store.iter_all_calls()  # calls outside rollouts come first
    else:
        calls = store.iter_llm_calls(key.rollout_id, key.attempt_id)
    async for call in calls:
        if call.rollout_id != key.rollout_id:
            break
        if call.started_at == key.started and call.attempt_id == key.attempt_id and call.choice_index == 0:
            return call
    return None


def assistant_message(codec: ChatCodec, call: LLMCall) -> dict[str, Any]:
    """The assistant message the stored call answered, as its client received it."""
    return _decoded(codec, call).to_openai()


def _decoded(codec: ChatCodec, call: LLMCall) -> AssistantMessage:
    stop_reason = "length" if call.finish_reason == "length" else "stop"
    return codec.decode_response(call.response_token_ids, stop_reason)


@dataclass(frozen=True)
class PriorTurns:
    """The conversation a `previous_response_id` names: the stored call's prompt and its response."""

    messages: list[dict[str, Any]]
    replace_instructions: bool
    """The new request has its own `instructions` (its first message), which replace the stored ones."""

    def before(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The bridged request's `messages` continuing these turns."""
        history = list(self.messages)
        leading = []
        if self.replace_instructions and messages:
            leading, messages = [messages[0]], messages[1:]
            while history and history[0].get("role") in ("system", "developer"):
                history.pop(0)
        return [*leading, *_answered(history, messages), *messages]


def _answered(history: list[dict[str, Any]], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`history` with its last tool calls carrying the ids the new tool results answer (in order).

    The stored response keeps its tokens, not the ids its client was sent; a client continuing it
    answers each call by that id.
    """
    calls = (history[-1].get("tool_calls") or []) if history else []
    results = [m.get("tool_call_id") for m in messages if m.get("role") == "tool"]
    if not calls or not results:
        return history
    renamed = [
        {**call, "id": results[index]} if index < len(results) and isinstance(results[index], str) else call
        for index, call in enumerate(calls)
    ]
    return [*history[:-1], {**history[-1], "tool_calls": renamed}]


async def resolve_previous_response(
    store: Store, codec: ChatCodec, body: dict[str, Any], route: RolloutRoute | None = None
) -> PriorTurns | None:
    """The turns a Responses request's `previous_response_id` continues (None without one); a 404
    `RequestError` naming the field when it names no stored call of `route`'s rollout."""
    previous = body.get("previous_response_id")
    if previous is None:
        return None
    if not isinstance(previous, str) or not previous:
        raise RequestError(f"previous_response_id must be a response id, got {previous!r:.100}", "previous_response_id")
    key = within(key_of(previous), route)
    call = None if key is None else await find_call(store, key)
    if call is None:
        raise RequestError(
            f"no response {previous[:100]!r} was served and recorded here in this rollout; send the id of an earlier "
            "response of this server (or the whole conversation as input)",
            "previous_response_id",
            code="not_found",
            status=404,
        )
    instructions = body.get("instructions")
    return PriorTurns([*call.messages, assistant_message(codec, call)], bool(instructions))


def make_responses_router(store: Store, codec: ChatCodec) -> APIRouter:
    """Routes over stored responses: retrieve, and the refusals of delete / cancel / input items."""
    router = APIRouter()

    async def stored(request: Request, response_id: str) -> LLMCall:
        key = within(key_of(response_id), route_of_headers(request.headers))
        call = None if key is None else await find_call(store, key)
        if call is None:
            raise RequestError(
                f"no response {response_id[:100]!r} was served and recorded here",
                "response_id",
                code="not_found",
                status=404,
            )
        return call

    async def retrieve(request: Request, response_id: str) -> JSONResponse:
        call = await stored(request, response_id)
        return JSONResponse(_as_response(codec, response_id, call))

    async def unsupported(request: Request, response_id: str) -> JSONResponse:
        await stored(request, response_id)
        action = "deleted" if request.method == "DELETE" else "cancelled or listed"
        raise RequestError(
            f"response {response_id[:100]!r} is a recorded training call and cannot be {action} here; "
            "responses are never run in the background",
            "response_id",
            code="unsupported",
            status=501,
        )

    for prefix in ("/v1/responses", "/responses"):
        router.add_api_route(prefix + "/{response_id}", retrieve, methods=["GET"])
        router.add_api_route(prefix + "/{response_id}", unsupported, methods=["DELETE"])
        router.add_api_route(prefix + "/{response_id}/cancel", unsupported, methods=["POST"])
        router.add_api_route(prefix + "/{response_id}/input_items", unsupported, methods=["GET"])
    return router


def _as_response(codec: ChatCodec, response_id: str, call: LLMCall) -> dict[str, Any]:
    """The stored call as the Responses object it was answered with (the request's own fields aside)."""
    writer = ResponsesWriter(response_id, call.model, int(call.started_at or 0), {})
    return writer.document(_decoded(codec, call), len(call.prompt_token_ids), len(call.response_token_ids))
