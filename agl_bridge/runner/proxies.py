"""Several proxies for one runner: which one each attempt talks to, and the check of each extra one.

A runner sends each attempt to one proxy for all its turns (the endpoint an agent gets is routed
there, and `emit_reward` delivers there). With extra proxies (`agl-bridge serve` processes on the
run's PostgreSQL store), each new attempt goes to the proxy with the fewest attempts in flight,
ties taken in turn: the load spreads evenly whatever the attempts' lengths (a hash of the rollout
id would leave one proxy with most of a small step), and a retry may land on another proxy.
Proxies are stateless (one that did not serve an attempt's earlier turns reads their tokens from
the store), so where an attempt goes changes how the load spreads, never what is recorded.

Before the first attempt an extra proxy serves, the runner checks it: it answers with its key,
serves the run's model, and records into the runner's store — `POST .../start` of that attempt
must find the rollout the runner created (origin `runner`). A proxy on another store registers
the attempt there as new (origin `external`); the runner finishes it there as failed and stops
with a `ConfigError` saying which proxy and what to do.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from agl_bridge import semconv
from agl_bridge.errors import ConfigError
from agl_bridge.types import RolloutOrigin

_CHECK_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ProxyAddress:
    """A proxy agents can be sent to: its root URL (`http://host:port`) and the key it requires."""

    url: str
    api_key: str = field(repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", self.url.rstrip("/"))


class ProxySpread:
    """The proxies of one runner: its own (beside its store, trusted) and extra ones, checked on first use."""

    def __init__(self, own: ProxyAddress, extra: Sequence[ProxyAddress], *, model: str) -> None:
        self.proxies = [own, *extra]
        urls = [proxy.url for proxy in self.proxies]
        if len(set(urls)) != len(urls):
            raise ConfigError(f"the proxies must differ (the run's own proxy and each extra one); got {urls}")
        self.model = model
        self._extra = set(urls[1:])
        self._in_flight = dict.fromkeys(urls, 0)
        self._turn = itertools.count()
        self._checks: dict[str, asyncio.Future[None]] = {}

    def take(self) -> ProxyAddress:
        """The proxy for a new attempt (the fewest attempts in flight; ties in turn), counted until `release`."""
        start = next(self._turn) % len(self.proxies)
        rotated = self.proxies[start:] + self.proxies[:start]
        chosen = min(rotated, key=lambda proxy: self._in_flight[proxy.url])
        self._in_flight[chosen.url] += 1
        return chosen

    def release(self, proxy: ProxyAddress) -> None:
        """An attempt on `proxy` ended."""
        self._in_flight[proxy.url] -= 1

    async def check(self, proxy: ProxyAddress, rollout_id: str, attempt_id: str) -> None:
        """Check an extra proxy once (the first attempt it gets is the probe); ConfigError if it is not fit."""
        if proxy.url not in self._extra:
            return
        check = self._checks.get(proxy.url)
        if check is None:
            check = self._checks[proxy.url] = asyncio.ensure_future(
                check_proxy(proxy, self.model, rollout_id, attempt_id)
            )
        await asyncio.shield(check)


async def check_proxy(proxy: ProxyAddress, model: str, rollout_id: str, attempt_id: str) -> None:
    """ConfigError unless `proxy` answers with its key, serves `model` and records into the store where the
    runner started (`rollout_id`, `attempt_id`)."""
    headers = {"Authorization": f"Bearer {proxy.api_key}"}
    async with httpx.AsyncClient(base_url=proxy.url, headers=headers, timeout=_CHECK_TIMEOUT_S) as client:
        try:
            models = await client.get("/v1/models")
        except httpx.HTTPError as error:
            raise ConfigError(
                f"the extra proxy {proxy.url} cannot be reached ({type(error).__name__}: {error}); start it "
                "(agl-bridge serve --store <the run's store> --sampler remote --sampler-url ...) or leave it out "
                "of proxy_urls"
            ) from None
        if models.status_code in (401, 403):
            raise ConfigError(
                f"the extra proxy {proxy.url} refused the key (HTTP {models.status_code}): set proxy_api_key to the "
                "key it was started with (its --api-key)"
            )
        served = _model_ids(models)
        if model not in served:
            raise ConfigError(
                f"the extra proxy {proxy.url} serves {served or 'no model'}, not the run's model {model!r}: start it "
                "with the run's model (agl-bridge serve --model ...)"
            )
        route = f"/rollout/{rollout_id}/attempt/{attempt_id}"
        started = await client.post(f"{route}{semconv.PATH_START}")
        if started.status_code != 200:
            raise ConfigError(
                f"the extra proxy {proxy.url} could not show that it records into the run's store: POST "
                f"{route}{semconv.PATH_START} answered HTTP {started.status_code}: {started.text[:300]}"
            )
        if started.json().get("origin") == RolloutOrigin.RUNNER.value:
            return
        # The attempt is a new rollout in another store: end it there (it is no run's), then say what is wrong.
        await client.post(
            f"{route}{semconv.PATH_FINISH}",
            json={"status": "failed", "error": "agl-bridge: a runner's check that this proxy shares its store"},
        )
        raise ConfigError(
            f"the extra proxy {proxy.url} records into another store than the run's (the attempt {rollout_id}/"
            f"{attempt_id} the runner started is unknown there): start it with --store set to the run's store, "
            "the same PostgreSQL database as the run's store key"
        )


def _model_ids(answer: httpx.Response) -> list[str]:
    try:
        entries = answer.json().get("data")
    except (ValueError, AttributeError):
        return []
    if not isinstance(entries, list):
        return []
    return [entry["id"] for entry in entries if isinstance(entry, dict) and isinstance(entry.get("id"), str)]
