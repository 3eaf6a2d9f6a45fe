"""Access: loopback by default, a key for anything else, the key on every route, a private store file.

What is public: the liveness/readiness probes (`/health/liveliness`, `/health/liveness`,
`/health/readiness`), which say only that the server is up. Everything else — every LiteLLM route,
ours (`/v1/completions`, `/v1/traces`), the same under `/rollout/{r}/attempt/{a}/`, websockets —
answers 401 (websockets: 403) without the key.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from agl_bridge.proxy.gateway import OPEN_PATHS, Gateway
from agl_bridge.proxy.server import ProxyStartError, choose_api_key, is_loopback
from agl_bridge.testing.checks import error_problem
from agl_bridge.testing.proxy_process import child_env

AGL_BRIDGE = str(Path(sys.executable).with_name("agl-bridge"))


def _concrete(path: str) -> str:
    """A route template with every {param} (and {param:path}) filled in."""
    return re.sub(r"\{[^}]+\}", "x1", path)


def _app_routes() -> list[tuple[str, str]]:
    """(method, path) of every HTTP route of the running proxy app: its OpenAPI document (LiteLLM's
    routes and ours) plus the routes and mounts left out of it (docs, UI assets)."""
    from litellm.proxy import proxy_server as litellm_proxy

    app = litellm_proxy.app
    routes = {
        (method.upper(), _concrete(path))
        for path, operations in app.openapi()["paths"].items()
        for method in operations
        if method.upper() not in ("HEAD", "OPTIONS")
    }
    for route in app.routes:
        path = getattr(route, "path", None)
        if path and type(route).__name__ == "Mount":
            routes.add(("GET", f"{path}/x1"))
        elif path and getattr(route, "methods", None):
            routes.update((m, _concrete(path)) for m in route.methods - {"HEAD", "OPTIONS"})
    return sorted(routes)


@pytest.mark.slow
def test_every_route_needs_the_key(proxy_server: Any) -> None:
    routes = _app_routes()
    assert len(routes) > 100, "expected LiteLLM's full route table"
    assert ("POST", "/v1/traces") in routes and ("POST", "/v1/completions") in routes

    async def probe() -> list[str]:
        problems: list[str] = []
        limit = asyncio.Semaphore(8)
        async with httpx.AsyncClient(base_url=proxy_server.base_url, timeout=60) as client:

            async def one(method: str, path: str, headers: dict[str, str]) -> None:
                async with limit:
                    response = await client.request(method, path, headers=headers, content=b"{}")
                if response.status_code != 401:
                    problems.append(f"{method} {path} {headers}: {response.status_code}")
                elif (problem := error_problem(path, response)) is not None:
                    problems.append(f"{method} {path}: {problem}")

            guarded = [(method, path) for method, path in routes if path not in OPEN_PATHS]
            # Every route without a key; every 8th also with a wrong key and under a rollout prefix
            # (the gateway refuses before routing, so these cover the same code for all routes).
            await asyncio.gather(
                *(one(method, path, {}) for method, path in guarded),
                *(one(method, path, {"Authorization": "Bearer sk-wrong"}) for method, path in guarded[::8]),
                *(one(method, "/rollout/r1/attempt/a1" + path, {}) for method, path in guarded[::8]),
            )
        return problems

    assert asyncio.run(probe()) == []


def test_the_public_probes_say_nothing_but_up(proxy_server: Any) -> None:
    for path in sorted(OPEN_PATHS):
        response = httpx.get(f"{proxy_server.base_url}{path}", timeout=30)
        assert response.status_code == 200, (path, response.text)
        assert proxy_server.api_key not in response.text and "sk-" not in response.text
        assert len(response.content) < 400, f"{path} says more than that it is up: {response.text[:400]}"


def test_websocket_routes_need_the_key(proxy_server: Any) -> None:
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    url = proxy_server.base_url.replace("http://", "ws://") + "/v1/realtime?model=tiny"
    with pytest.raises(InvalidStatus) as refused:
        with connect(url, open_timeout=30):
            pass
    assert refused.value.response.status_code == 403


async def test_gateway_closes_unkeyed_websockets_before_the_app_sees_them() -> None:
    reached: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope)

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    gateway = Gateway(app, api_key="sk-right")
    for headers in ([], [(b"authorization", b"Bearer sk-wrong")]):
        await gateway({"type": "websocket", "path": "/v1/realtime", "headers": headers}, receive, send)
    assert reached == [] and [m["type"] for m in sent] == ["websocket.close", "websocket.close"]
    await gateway(
        {"type": "websocket", "path": "/v1/realtime", "headers": [(b"authorization", b"Bearer sk-right")]},
        receive,
        send,
    )
    assert len(reached) == 1


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_loopback_binds_get_a_generated_key(host: str) -> None:
    key, generated = choose_api_key(host, None)
    assert generated and key.startswith("sk-agl-") and len(key) > 30
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "example.com"])
def test_a_non_loopback_bind_needs_an_explicit_key(host: str) -> None:
    with pytest.raises(ProxyStartError, match="--api-key"):
        choose_api_key(host, None)
    assert choose_api_key(host, "sk-mine") == ("sk-mine", False)


def test_serve_defaults_to_loopback() -> None:
    import inspect

    from agl_bridge.cli import serve_command
    from agl_bridge.proxy.server import ProxyServer

    assert inspect.signature(serve_command).parameters["host"].default.default == "127.0.0.1"
    assert inspect.signature(ProxyServer).parameters["host"].default == "127.0.0.1"


@pytest.mark.slow
def test_serve_refuses_a_public_bind_without_a_key_before_loading_the_model(tmp_path: Path) -> None:
    """The model path does not exist: an error about the key proves the check comes first (and fast)."""
    started = time.monotonic()
    result = subprocess.run(
        [
            AGL_BRIDGE,
            "serve",
            "--model",
            str(tmp_path / "no-such-model"),
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "--store",
            str(tmp_path / "s.sqlite"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
    )
    assert result.returncode == 2, result.stderr
    assert "--api-key" in result.stderr and "no-such-model" not in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "s.sqlite").exists()
    assert time.monotonic() - started < 60


def _mode(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_proxy_store_and_its_wal_and_shm_are_private(proxy_server: Any) -> None:
    path = str(proxy_server.store_path)
    assert _mode(path) == 0o600
    for suffix in ("-wal", "-shm"):
        if os.path.exists(path + suffix):
            assert _mode(path + suffix) == 0o600, suffix


async def test_a_new_store_is_private_even_under_a_permissive_umask(tmp_path: Path) -> None:
    from agl_bridge.store import SQLiteStore
    from agl_bridge.types import LLMCall

    previous = os.umask(0)
    try:
        async with SQLiteStore(tmp_path / "open" / "s.sqlite") as store:
            await store.add_llm_call(
                LLMCall(
                    rollout_id="ro-1",
                    attempt_id="at-1",
                    model="m",
                    prompt_token_ids=[1],
                    response_token_ids=[2],
                    response_logprobs=[-0.5],
                )
            )
            for suffix in ("", "-wal", "-shm"):
                assert _mode(f"{store.path}{suffix}") == 0o600, suffix
    finally:
        os.umask(previous)
