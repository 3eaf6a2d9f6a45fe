"""Fixtures for the reliability tests.

In-process tests share the session `proxy_server` (tests/conftest.py; the tiny model). Tests that
kill or freeze a proxy start their own in a subprocess with `start_proxy` and stop it in a
finalizer, so nothing outlives a failing test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agl_bridge.testing.proxy_process import ProxyProcess, start_proxy


@pytest.fixture
def proxy_process(tiny_model_dir: Path, tmp_path: Path) -> Iterator[Callable[..., ProxyProcess]]:
    """A factory of subprocess proxies (`start_proxy` arguments); every one is stopped at teardown."""
    started: list[ProxyProcess] = []

    def start(store: Path | None = None, **options: object) -> ProxyProcess:
        proxy = start_proxy(store or tmp_path / "store.sqlite", tiny_model_dir, **options)  # type: ignore[arg-type]
        started.append(proxy)
        return proxy

    try:
        yield start
    finally:
        for proxy in started:
            proxy.stop()
