"""`start_rollout` / `finish_rollout`: the rollout lifecycle from Python, over the proxy's HTTP routes.

For harnesses and agents we do not launch (the runner starts and finishes its own attempts: an
agent it runs must not call these). The rollout is found as `emit_reward` finds it: explicit
`rollout_id` / `attempt_id` arguments, else the active `rollout_context`, else the `AGL_*`
environment; the proxy's address and key come from the same place (`AGL_ENDPOINT`, `AGL_API_KEY`
or `OPENAI_API_KEY`) or from `endpoint=` / `api_key=`. Each call returns once the store has
committed the change, with the rollout as it now is; a refusal raises `LifecycleError` carrying
the HTTP status and the server's message (404 unknown attempt, 409 finished or another task).
"""

from __future__ import annotations

from typing import Any

import httpx

from agl_bridge import semconv
from agl_bridge.tracing.context import normalize_endpoint
from agl_bridge.tracing.rewards import resolve_rollout

DEFAULT_TIMEOUT_S = 30.0


class LifecycleError(RuntimeError):
    """The proxy refused a lifecycle request, or could not be reached; `status` is the HTTP status (0: none)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def start_rollout(
    task_id: str | None = None,
    *,
    metadata: Any = None,
    eval: bool | None = None,
    rollout_id: str | None = None,
    attempt_id: str | None = None,
    endpoint: str | None = None,
    api_key: str | None = None,
) -> dict[str, Any]:
    """Register the current attempt as running and name its task (rollouts of one task form one GRPO group).

    Optional: the first call under the attempt registers it too; name the task here when its
    group must be known before the attempt ends (a follow trainer waits for whole groups).
    Needs the operator key. The answer's `agent_key` is a key scoped to this attempt's model routes:
    give the agent that key (as its OpenAI `api_key`), never the operator key, and report the
    reward here in the harness (`emit_reward(..., api_key=...)` is not needed: the harness holds the
    operator key in `AGL_API_KEY` or passes `api_key=`).
    """
    body = _task_body(task_id, metadata, eval)
    return _post(semconv.PATH_START, body, rollout_id, attempt_id, endpoint, api_key)


def finish_rollout(
    status: str = "succeeded",
    error: str | None = None,
    *,
    task_id: str | None = None,
    metadata: Any = None,
    eval: bool | None = None,
    rollout_id: str | None = None,
    attempt_id: str | None = None,
    endpoint: str | None = None,
    api_key: str | None = None,
) -> dict[str, Any]:
    """Finish the current attempt with its outcome ("succeeded", "failed" or "timed_out") and optional error text.

    Report rewards first (`emit_reward`): a finished attempt takes none. Its rollout ends once
    none of its attempts runs; only succeeded attempts of finished rollouts ever train.
    """
    body: dict[str, Any] = {"status": status, **_task_body(task_id, metadata, eval)}
    if error is not None:
        body["error"] = error
    return _post(semconv.PATH_FINISH, body, rollout_id, attempt_id, endpoint, api_key)


def _task_body(task_id: str | None, metadata: Any, is_eval: bool | None) -> dict[str, Any]:
    given = {"task_id": task_id, "metadata": metadata, "eval": is_eval}
    return {key: value for key, value in given.items() if value is not None}


def _post(
    path: str,
    body: dict[str, Any],
    rollout_id: str | None,
    attempt_id: str | None,
    endpoint: str | None,
    api_key: str | None,
) -> dict[str, Any]:
    rollout = resolve_rollout(rollout_id, attempt_id)
    if rollout.attempt_id is None:
        raise ValueError(
            f"rollout {rollout.rollout_id!r} has no attempt id; pass attempt_id=... (or set {semconv.ENV_ATTEMPT_ID})"
        )
    base = normalize_endpoint(endpoint) if endpoint is not None else rollout.endpoint
    if base is None:
        raise LifecycleError(
            f"no proxy address for rollout {rollout.rollout_id!r}: pass endpoint=... or set {semconv.ENV_ENDPOINT}"
        )
    key = api_key or rollout.api_key
    url = f"{base}/rollout/{rollout.rollout_id}/attempt/{rollout.attempt_id}{path}"
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        response = httpx.post(url, json=body, headers=headers, timeout=DEFAULT_TIMEOUT_S)
    except httpx.HTTPError as error:
        raise LifecycleError(f"POST {url} failed: {error}") from error
    if response.status_code != 200:
        raise LifecycleError(f"POST {url} answered {response.status_code}: {_message(response)}", response.status_code)
    answer: dict[str, Any] = response.json()
    return answer


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:500]
