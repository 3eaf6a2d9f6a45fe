"""Which server a sampling request should stick to: the rollout it belongs to, carried in a context variable.

Remote samplers keep the requests of one rollout on one server so that its prefix cache is reused
turn after turn. The proxy knows the rollout of every request but the `TokenSampler` protocol does
not carry it, so the proxy sets it here for the duration of the request (see
`agl_bridge.proxy.gateway`) and a sampler that cares reads it. Samplers that do not care ignore it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_AFFINITY: ContextVar[str | None] = ContextVar("agl_sampling_affinity", default=None)


def current_affinity() -> str | None:
    """The affinity key of the request being served (a rollout id), or None outside rollouts."""
    return _AFFINITY.get()


@contextmanager
def sampling_affinity(key: str | None) -> Iterator[None]:
    """Run the block with `key` as the affinity key (None clears it); restored afterwards."""
    token = _AFFINITY.set(key)
    try:
        yield
    finally:
        _AFFINITY.reset(token)
