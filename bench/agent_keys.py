"""What the scoped-key check adds per request on the chat route: operator key (today's path) vs agent key.

The front door (`agl_bridge.proxy.gateway.Gateway`) is driven directly as an ASGI app, with an
instant app behind it on the chat route (`/rollout/R/attempt/A/v1/chat/completions`, a body naming
a model the gateway does not serve, so it goes to the app behind), so the figures are the door's
own work: key check, routing, body read, dispatch. Requests alternate between the two keys so
both see the same machine state. Also timed alone: `Gateway.principal` for each key (the check
itself). Prints one JSON line.

    PYTHONPATH=$PWD .venv/bin/python bench/agent_keys.py [--requests 20000]

Today's figure (before agent keys): run the same script over the code before them; it then times the
operator key only (`"agent_keys": false`), e.g.
    git archive 54b6bd8 agl_bridge | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before .venv/bin/python bench/agent_keys.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from agl_bridge.proxy.gateway import Gateway

try:
    from agl_bridge.agent_keys import AgentKeys
except ImportError:  # the code before agent keys: time the operator key alone
    AgentKeys = None  # type: ignore[assignment,misc]

OPERATOR_KEY = "sk-bench-operator-key-0123456789"
BODY = json.dumps({"model": "other", "messages": [{"role": "user", "content": "hi"}]}).encode()


async def _instant(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"{}"})


async def _one(gateway: Gateway, headers: list[tuple[bytes, bytes]]) -> float:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/rollout/ro-bench/attempt/at-0/v1/chat/completions",
        "raw_path": b"/rollout/ro-bench/attempt/at-0/v1/chat/completions",
        "query_string": b"",
        "headers": headers,
    }
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": BODY, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    statuses: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    started = time.perf_counter()
    await gateway(scope, receive, send)
    elapsed = time.perf_counter() - started
    assert statuses == [200], statuses
    return elapsed


async def _requests(count: int) -> dict[str, float]:
    gateway = Gateway(_instant, api_key=OPERATOR_KEY)
    base = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]
    keys = {"operator": [*base, (b"authorization", f"Bearer {OPERATOR_KEY}".encode())]}
    if AgentKeys is not None:
        agent_key = AgentKeys(OPERATOR_KEY).mint("ro-bench", "at-0", ttl_s=3600)
        keys["agent"] = [*base, (b"authorization", f"Bearer {agent_key}".encode())]
    for _ in range(500):  # warm-up
        for headers in keys.values():
            await _one(gateway, headers)
    times: dict[str, list[float]] = {name: [] for name in keys}
    for _ in range(count):
        for name, headers in keys.items():
            times[name].append(await _one(gateway, headers))
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def _check_alone(count: int) -> dict[str, float]:
    assert AgentKeys is not None
    gateway = Gateway(_instant, api_key=OPERATOR_KEY)
    agent_key = AgentKeys(OPERATOR_KEY).mint("ro-bench", "at-0", ttl_s=3600)
    figures = {}
    for name, key in (("operator", OPERATOR_KEY), ("agent", agent_key)):
        headers = [(b"authorization", f"Bearer {key}".encode())]
        samples = []
        for _ in range(count):
            started = time.perf_counter()
            gateway.principal(headers)
            samples.append(time.perf_counter() - started)
        figures[name] = statistics.median(samples) * 1e3
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000, help="requests per key")
    args = parser.parse_args()
    requests = asyncio.run(_requests(args.requests))
    if AgentKeys is None:
        figures = {"chat_route_p50_ms_operator_key": round(requests["operator"], 4)}
        print(json.dumps({"bench": "agent_keys", "agent_keys": False, "requests_per_key": args.requests, **figures}))
        return
    alone = _check_alone(args.requests)
    print(
        json.dumps(
            {
                "bench": "agent_keys",
                "agent_keys": True,
                "requests_per_key": args.requests,
                "chat_route_p50_ms_operator_key": round(requests["operator"], 4),
                "chat_route_p50_ms_agent_key": round(requests["agent"], 4),
                "added_p50_ms_agent_vs_operator": round(requests["agent"] - requests["operator"], 4),
                "key_check_p50_ms_operator": round(alone["operator"], 4),
                "key_check_p50_ms_agent": round(alone["agent"], 4),
            }
        )
    )


if __name__ == "__main__":
    main()
