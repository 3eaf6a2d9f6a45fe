"""Which rollout the running agent code belongs to: a context variable, else environment variables.

The runner tells agent code which (rollout, attempt) it is running in one of two ways:
  - in-process agents: `with rollout_context(rollout_id, attempt_id, endpoint=...):` around the
    agent call. The value lives in a `contextvars.ContextVar`, so it follows asyncio tasks
    created inside the block and threads started through `contextvars.copy_context().run(...)`
    (or `asyncio.to_thread`), and two agents running concurrently in one process never see each
    other's rollout;
  - subprocess agents: the environment variables `AGL_ROLLOUT_ID`, `AGL_ATTEMPT_ID`,
    `AGL_ENDPOINT` and `AGL_API_KEY` (or the `OPENAI_API_KEY` the agent already uses).

`current_rollout()` prefers the context variable and falls back to the environment.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from agl_bridge import semconv


@dataclass(frozen=True, slots=True)
class RolloutContext:
    """The (rollout, attempt) agent code runs in, and where and how to reach the proxy.

    `endpoint` is the proxy's base URL; both `http://host:4000` and `http://host:4000/v1` are
    accepted and stored without the `/v1` (and without a trailing slash). `api_key` is sent as
    `Authorization: Bearer ...` when spans are exported to the proxy; it is left out of `repr`.
    """

    rollout_id: str
    attempt_id: str | None = None
    endpoint: str | None = None
    api_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.rollout_id, str) or not self.rollout_id:
            raise ValueError(f"rollout_id must be a non-empty string, got {self.rollout_id!r}")
        for name in ("attempt_id", "api_key"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string or None, got {value!r}")
        if self.endpoint is not None:
            object.__setattr__(self, "endpoint", normalize_endpoint(self.endpoint))


def normalize_endpoint(endpoint: str) -> str:
    """The proxy base URL without trailing slashes and without a trailing `/v1`.

    Raises ValueError for anything that is not an http(s) URL, naming the value.
    """
    if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
        raise ValueError(
            f"the agl_bridge endpoint must be the proxy's http(s) base URL, e.g. 'http://127.0.0.1:4000', "
            f"got {endpoint!r}"
        )
    base = endpoint.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base


_CURRENT: contextvars.ContextVar[RolloutContext | None] = contextvars.ContextVar("agl_rollout", default=None)


@contextmanager
def rollout_context(
    rollout: str | RolloutContext,
    attempt_id: str | None = None,
    *,
    endpoint: str | None = None,
    api_key: str | None = None,
) -> Iterator[RolloutContext]:
    """Run the block as part of a rollout: `with rollout_context("ro-1", "at-1", endpoint=url):`.

    Pass either the ids (and optionally the endpoint and key) or a ready `RolloutContext`.
    Blocks nest; the previous value is restored on exit.
    """
    if isinstance(rollout, RolloutContext):
        if attempt_id is not None or endpoint is not None or api_key is not None:
            raise ValueError(
                "rollout_context() got a RolloutContext and also attempt_id/endpoint/api_key; pass one or "
                "the other (use dataclasses.replace to change a field of a RolloutContext)"
            )
        value = rollout
    else:
        value = RolloutContext(rollout, attempt_id, endpoint, api_key)
    token = _CURRENT.set(value)
    try:
        yield value
    finally:
        _CURRENT.reset(token)


def env_rollout() -> RolloutContext | None:
    """The rollout described by `AGL_ROLLOUT_ID` and friends, or None when that variable is unset.

    Raises ValueError (naming the variable) when a variable is set to something unusable.
    """
    rollout_id = os.environ.get(semconv.ENV_ROLLOUT_ID) or None
    if rollout_id is None:
        return None
    endpoint = env_endpoint()
    try:
        return RolloutContext(rollout_id, os.environ.get(semconv.ENV_ATTEMPT_ID) or None, endpoint, env_api_key())
    except ValueError as exc:
        raise ValueError(
            f"the {semconv.ENV_ROLLOUT_ID}/{semconv.ENV_ATTEMPT_ID} environment is unusable: {exc}"
        ) from None


def env_endpoint() -> str | None:
    """`AGL_ENDPOINT`, normalized (see `normalize_endpoint`), or None when unset or empty."""
    raw = os.environ.get(semconv.ENV_ENDPOINT) or None
    if raw is None:
        return None
    try:
        return normalize_endpoint(raw)
    except ValueError as exc:
        raise ValueError(f"environment variable {semconv.ENV_ENDPOINT} is unusable: {exc}") from None


def env_api_key() -> str | None:
    """`AGL_API_KEY`, else `OPENAI_API_KEY`, else None (empty values count as unset)."""
    return os.environ.get(semconv.ENV_API_KEY) or os.environ.get(semconv.ENV_OPENAI_API_KEY) or None


def current_rollout() -> RolloutContext | None:
    """The rollout this code runs in: the active `rollout_context`, else the environment, else None.

    A context without an endpoint or key borrows `AGL_ENDPOINT` / the key variables, so an
    in-process runner may set just the ids and leave the proxy address in the environment.
    """
    value = _CURRENT.get()
    if value is None:
        return env_rollout()
    if value.endpoint is None or value.api_key is None:
        endpoint = value.endpoint if value.endpoint is not None else env_endpoint()
        api_key = value.api_key if value.api_key is not None else env_api_key()
        if endpoint != value.endpoint or api_key != value.api_key:
            return RolloutContext(value.rollout_id, value.attempt_id, endpoint, api_key)
    return value


def current_rollout_ids() -> tuple[str, str | None] | None:
    """Just the (rollout_id, attempt_id) of `current_rollout()`, never raising.

    For hot paths that only attribute (the span stamping processor): it does not look at the
    endpoint or key variables, so a malformed `AGL_ENDPOINT` cannot break span creation.
    """
    value = _CURRENT.get()
    if value is not None:
        return value.rollout_id, value.attempt_id
    rollout_id = os.environ.get(semconv.ENV_ROLLOUT_ID) or None
    if rollout_id is None:
        return None
    return rollout_id, os.environ.get(semconv.ENV_ATTEMPT_ID) or None
