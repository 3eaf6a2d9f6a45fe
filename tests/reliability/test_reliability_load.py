"""Load held: concurrent rollouts through the proxy lose no call and mix none up.

CI size: 32 rollouts × 10 turns on the session proxy (tiny model). The full size (256 × 10 with the
tiny model and with the instant sampler, and 100,000 calls with the store size and proxy RSS
tracked) is `bench/reliability_load.py`; its latest figures are in docs/reliability.md.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agl_bridge.testing.checks import integrity
from agl_bridge.testing.load import run_load

pytestmark = pytest.mark.slow


def test_32_concurrent_rollouts_of_10_calls_lose_and_mix_nothing(proxy_server: Any) -> None:
    report = asyncio.run(
        run_load(proxy_server.base_url, proxy_server.api_key, proxy_server.store_path, rollouts=32, calls=10)
    )
    summary = report.summary()
    print("load:", summary)
    assert summary["calls_stored"] == summary["calls_expected"] == 320, summary
    assert (report.lost, report.misattributed, report.out_of_order, report.rollouts_failed, report.http_errors) == (
        0,
        0,
        0,
        0,
        0,
    ), summary
    assert integrity(proxy_server.store_path) == "ok"
