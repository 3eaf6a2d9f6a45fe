"""A proxy on a PostgreSQL store survives the database going away: 503 `store_unavailable`, then recovery.

The proxy runs in a subprocess (`agl_bridge.testing.serve`) on a throwaway PostgreSQL server of
its own, which the test stops and starts again under it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from shared_helpers import new_id

from agl_bridge.store import PostgresStore
from agl_bridge.testing.postgres import PostgresServer, PostgresUnavailable, start_postgres
from agl_bridge.testing.proxy_process import start_proxy

pytestmark = pytest.mark.slow


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server this test may stop and start."""
    try:
        server = start_postgres()
    except PostgresUnavailable as exc:
        pytest.skip(f"no PostgreSQL server can run here: {exc}")
    try:
        yield server
    finally:
        server.stop()


def _chat(client: httpx.Client, base: str, rollout_id: str, text: str) -> httpx.Response:
    return client.post(
        f"{base}/rollout/{rollout_id}/attempt/0/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 4},
    )


async def test_the_database_going_away_answers_503_and_the_proxy_recovers_when_it_is_back(
    own_postgres: PostgresServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    proxy = start_proxy(own_postgres.dsn(), tiny_model_dir, log_dir=tmp_path)
    rollout_id = new_id("ro")
    try:
        with httpx.Client(headers={"Authorization": f"Bearer {proxy.api_key}"}, timeout=60) as client:
            assert _chat(client, proxy.base_url, rollout_id, "before").status_code == 200
            own_postgres.stop(keep_files=True)
            refused = _chat(client, proxy.base_url, rollout_id, "while down")
            assert refused.status_code == 503, refused.text
            error = refused.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["code"] == "store_unavailable" and "unreachable" in error["message"]
            assert "postgresql://" in error["message"]  # the host itself is redacted for clients
            own_postgres.start()
            assert _chat(client, proxy.base_url, rollout_id, "after").status_code == 200  # recovered, no restart
    finally:
        proxy.stop()
    async with PostgresStore(own_postgres.dsn()) as store:
        calls = [call async for call in store.iter_llm_calls(rollout_id, "0")]
    assert [c.sequence for c in calls] == [0, 1]  # the refused call left nothing, not even a sequence
    assert ["before" in str(calls[0].messages), "after" in str(calls[1].messages)] == [True, True]
