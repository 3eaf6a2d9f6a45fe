"""What an agent gets to talk to the model for one rollout attempt."""

from __future__ import annotations

import functools
import ssl
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible endpoint routed to one rollout attempt.

    `base_url` already carries the rollout and attempt, so any OpenAI-compatible client pointed at
    it records its calls in the right place; `server_url` is the proxy's root (for `emit_reward`).
    `api_key` is an agent key scoped to this attempt (`agl_bridge.agent_keys`): it reaches the
    attempt's model routes and nothing else. `harness_key` is the proxy's operator key, for code as
    trusted as the harness (a function agent's `emit_reward` runs in the harness's own process,
    which holds that key anyway); an `AgentCommand` never gets it.
    """

    base_url: str
    api_key: str = field(repr=False)
    model: str
    rollout_id: str
    attempt_id: str
    server_url: str
    harness_key: str | None = field(default=None, repr=False)

    @property
    def reward_key(self) -> str:
        """The key `emit_reward` sends for this attempt: the harness's where it is given, else the agent's."""
        return self.harness_key or self.api_key

    def openai_client(self, **kwargs: Any) -> Any:
        """An `openai.OpenAI` client for this endpoint."""
        from openai import DefaultHttpxClient, OpenAI

        kwargs.setdefault("http_client", DefaultHttpxClient(verify=_tls_context()))
        return OpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)

    def async_openai_client(self, **kwargs: Any) -> Any:
        """An `openai.AsyncOpenAI` client for this endpoint."""
        from openai import AsyncOpenAI, DefaultAsyncHttpxClient

        kwargs.setdefault("http_client", DefaultAsyncHttpxClient(verify=_tls_context()))
        return AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One TLS context for every client an agent makes: building one loads the CA certificates, which
    cost ~10 ms of CPU per client (and so per rollout), far more than the call through the proxy."""
    import httpx

    return httpx.create_ssl_context()
