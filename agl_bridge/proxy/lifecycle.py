"""The rollout lifecycle over plain HTTP, for harnesses we do not launch: start, reward, finish.

Each route sits under the same rollout prefix, key and routing rules as the chat routes (the
gateway turns `/rollout/{rollout_id}/attempt/{attempt_id}/...` into the `x-rollout-id` /
`x-attempt-id` headers, which may also be sent as such), and is one of our bare routes on the
front door: no LiteLLM middleware in its way. Bodies are JSON objects; refusals are raised and
shaped by `agl_bridge.proxy.errors` in the OpenAI error shape.

  - `POST .../start`  `{"task_id"?, "metadata"?, "eval"?}`: registers the attempt as running (its
    first call would too) and names its task — the rollouts of one task form one GRPO group —
    with its metadata, and marks held-out (eval) rollouts. 409 for a finished attempt or rollout,
    or a rollout id already used for another task.
  - `POST .../reward` `{"value", "name"?}`: stores a reward, ordered after every call whose answer
    the harness has read. 400 naming `value` if it is not a finite number; 409 for a finished attempt.
  - `POST .../finish` `{"status": "succeeded"|"failed"|"timed_out", "error"?, "task_id"?, "metadata"?,
    "eval"?}`: the attempt's outcome; the rollout ends with its last running attempt. 404 for an
    unknown attempt, 409 for one already finished.
  - `POST .../agent_key` `{"ttl_s"?}`: an agent key scoped to the attempt (`agl_bridge.agent_keys`),
    to hand to the agent instead of the operator key; `start` answers one too (`agent_key`).
Every answer is the rollout as it now is (`rollout_json`), plus the reward's sequence for `reward`.
Only the operator key reaches these routes (the gateway answers an agent key 404): an agent cannot
start, grade or finish any attempt, its own included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from agl_bridge import semconv
from agl_bridge.agent_keys import AgentKeys
from agl_bridge.proxy.completions import read_json_object
from agl_bridge.proxy.request import RequestError, route_of_headers
from agl_bridge.store.base import Store
from agl_bridge.types import DEFAULT_REWARD_NAME, AttemptStatus, Reward, Rollout, RolloutTask, finite_real

_OUTCOMES = tuple(status.value for status in AttemptStatus if status.is_final)


def make_lifecycle_router(store: Callable[[], Store], keys: AgentKeys | None = None) -> APIRouter:
    """The `start`, `reward` and `finish` routes over the store `store()` returns when a request comes, and
    with `keys` the `agent_key` route (and an `agent_key` in `start`'s answer)."""
    router = APIRouter()

    async def start(request: Request) -> JSONResponse:
        rollout_id, attempt_id = _route(request)
        body = await _optional_body(request)
        rollout = await store().register_attempt(rollout_id, attempt_id, task_of(body))
        answer = rollout_json(rollout, attempt_id)
        if keys is not None:
            answer["agent_key"] = keys.mint(rollout_id, attempt_id)
        return JSONResponse(answer)

    async def agent_key(request: Request) -> JSONResponse:
        assert keys is not None  # the route exists only with keys
        rollout_id, attempt_id = _route(request)
        body = await _optional_body(request)
        ttl = body.get("ttl_s")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < 1e9):
            raise RequestError(
                f"ttl_s must be a positive number of seconds (or absent: no expiry), got {ttl!r}", "ttl_s"
            )
        key = keys.mint(rollout_id, attempt_id, ttl_s=ttl)
        return JSONResponse({"rollout_id": rollout_id, "attempt_id": attempt_id, "agent_key": key, "ttl_s": ttl})

    async def reward(request: Request) -> JSONResponse:
        rollout_id, attempt_id = _route(request)
        body = await read_json_object(request)
        record = Reward(rollout_id=rollout_id, attempt_id=attempt_id, value=reward_value(body), name=_name(body))
        sequence = await store().report_reward(record)
        answer = {"rollout_id": rollout_id, "attempt_id": attempt_id, "sequence": sequence}
        return JSONResponse(answer | {"name": record.name, "value": record.value})

    async def finish(request: Request) -> JSONResponse:
        rollout_id, attempt_id = _route(request)
        body = await read_json_object(request)
        status = body.get("status")
        if status not in _OUTCOMES:
            raise RequestError(f"status must be one of {', '.join(_OUTCOMES)}, got {status!r}", "status")
        error = body.get("error")
        if error is not None and not isinstance(error, str):
            raise RequestError(f"error must be a string (what went wrong) or null, got {error!r}", "error")
        rollout = await store().complete_attempt(
            rollout_id, attempt_id, AttemptStatus(status), error=error, task=task_of(body)
        )
        return JSONResponse(rollout_json(rollout, attempt_id))

    for path, handler in ((semconv.PATH_START, start), (semconv.PATH_REWARD, reward), (semconv.PATH_FINISH, finish)):
        router.add_api_route(path, handler, methods=["POST"])
    if keys is not None:
        router.add_api_route(semconv.PATH_AGENT_KEY, agent_key, methods=["POST"])
    return router


def rollout_json(rollout: Rollout, attempt_id: str) -> dict[str, Any]:
    """What a lifecycle route answers: the rollout's state after the request."""
    return {
        "rollout_id": rollout.rollout_id,
        "attempt_id": attempt_id,
        "status": rollout.status.value,
        "task_id": rollout.group_id,
        "eval": rollout.eval,
        "attempts": rollout.attempts,
        "origin": rollout.origin.value,
    }


def reward_value(body: dict[str, Any]) -> float:
    """The body's reward `value` as a float; a 400 naming `value` unless it is a finite number."""
    if "value" not in body:
        raise RequestError('the reward needs a "value": a finite number, e.g. {"value": 1.0}', "value")
    try:
        return finite_real("value", body["value"])
    except ValueError:
        raise RequestError(
            f"value must be a finite number (not a string, bool, NaN or infinity), got {body['value']!r}", "value"
        ) from None


def task_of(body: dict[str, Any]) -> RolloutTask | None:
    """The task a start or finish body names (None when it names none); a 400 naming the bad field."""
    task_id, metadata, is_eval = body.get("task_id"), body.get("metadata"), body.get("eval")
    if task_id is None and metadata is None and is_eval is None:
        return None
    if task_id is not None and (not isinstance(task_id, str) or not task_id or len(task_id) > 256):
        raise RequestError(f"task_id must be a non-empty string of at most 256 characters, got {task_id!r}", "task_id")
    if is_eval is not None and not isinstance(is_eval, bool):
        raise RequestError(f"eval must be true or false, got {is_eval!r}", "eval")
    return RolloutTask(task_id=task_id, metadata=metadata, eval=is_eval)


def _name(body: dict[str, Any]) -> str:
    name = body.get("name", DEFAULT_REWARD_NAME)
    if not isinstance(name, str) or not name:
        raise RequestError(f"name must be a non-empty string (which reward this is), got {name!r}", "name")
    return name


def _route(request: Request) -> tuple[str, str]:
    route = route_of_headers(request.headers)
    if route.rollout_id is None or route.attempt_id is None:
        raise RequestError(
            f"{request.url.path} needs a rollout attempt: call it under /rollout/ROLLOUT_ID/attempt/ATTEMPT_ID "
            f"(or send the {semconv.HEADER_ROLLOUT_ID} and {semconv.HEADER_ATTEMPT_ID} headers)",
            semconv.HEADER_ROLLOUT_ID if route.rollout_id is None else semconv.HEADER_ATTEMPT_ID,
        )
    return route.rollout_id, route.attempt_id


async def _optional_body(request: Request) -> dict[str, Any]:
    return await read_json_object(request) if await request.body() else {}
