"""Rollout context: the context variable, its propagation, and the environment fallback."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from agl_bridge import semconv
from agl_bridge.tracing import RolloutContext, current_rollout, rollout_context
from agl_bridge.tracing.context import current_rollout_ids, normalize_endpoint


def test_no_context_and_no_env_means_no_rollout() -> None:
    assert current_rollout() is None
    assert current_rollout_ids() is None


def test_env_describes_the_rollout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(semconv.ENV_ROLLOUT_ID, "ro-env")
    monkeypatch.setenv(semconv.ENV_ATTEMPT_ID, "at-env")
    monkeypatch.setenv(semconv.ENV_ENDPOINT, "http://127.0.0.1:4000/v1/")
    monkeypatch.setenv(semconv.ENV_OPENAI_API_KEY, "sk-openai")
    assert current_rollout() == RolloutContext("ro-env", "at-env", "http://127.0.0.1:4000", "sk-openai")
    monkeypatch.setenv(semconv.ENV_API_KEY, "sk-agl")  # the specific variable wins
    assert current_rollout().api_key == "sk-agl"  # type: ignore[union-attr]


def test_env_endpoint_alone_is_not_a_rollout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(semconv.ENV_ENDPOINT, "http://127.0.0.1:4000")
    assert current_rollout() is None


def test_context_wins_over_env_and_borrows_the_env_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(semconv.ENV_ROLLOUT_ID, "ro-env")
    monkeypatch.setenv(semconv.ENV_ENDPOINT, "http://proxy:4000")
    with rollout_context("ro-ctx", "at-ctx") as ctx:
        assert ctx == RolloutContext("ro-ctx", "at-ctx")
        assert current_rollout() == RolloutContext("ro-ctx", "at-ctx", "http://proxy:4000")
        with rollout_context("ro-inner", endpoint="http://other:1/v1"):
            assert current_rollout() == RolloutContext("ro-inner", None, "http://other:1")
        assert current_rollout_ids() == ("ro-ctx", "at-ctx")
    assert current_rollout_ids() == ("ro-env", None)


def test_malformed_env_endpoint_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(semconv.ENV_ROLLOUT_ID, "ro-env")
    monkeypatch.setenv(semconv.ENV_ENDPOINT, "127.0.0.1:4000")
    with pytest.raises(ValueError, match="AGL_ENDPOINT.*http"):
        current_rollout()
    assert current_rollout_ids() == ("ro-env", None)  # the hot path never raises


def test_context_follows_asyncio_tasks_and_copied_thread_contexts() -> None:
    seen: dict[str, object] = {}

    async def agent(tag: str) -> None:
        await asyncio.sleep(0)
        seen[tag] = current_rollout_ids()

    async def main() -> None:
        async def run(rollout: str) -> None:
            with rollout_context(rollout, "at-1"):
                await asyncio.gather(agent(rollout), asyncio.create_task(agent(rollout + "-task")))

        await asyncio.gather(run("ro-a"), run("ro-b"))  # concurrent agents never see each other's rollout

    asyncio.run(main())
    assert seen == {
        "ro-a": ("ro-a", "at-1"),
        "ro-a-task": ("ro-a", "at-1"),
        "ro-b": ("ro-b", "at-1"),
        "ro-b-task": ("ro-b", "at-1"),
    }

    with rollout_context("ro-thread"):
        copied = contextvars.copy_context()
    thread = threading.Thread(target=lambda: seen.__setitem__("copied", copied.run(current_rollout_ids)))
    plain = threading.Thread(target=lambda: seen.__setitem__("plain", current_rollout_ids()))
    for t in (thread, plain):
        t.start()
        t.join()
    assert seen["copied"] == ("ro-thread", None)
    assert seen["plain"] is None  # a thread that does not copy the context is outside the rollout


def test_rollout_context_accepts_a_ready_context_but_not_both_forms() -> None:
    ready = RolloutContext("ro-1", "at-1", "http://h:1", "sk")
    with rollout_context(ready) as ctx:
        assert ctx is ready and current_rollout() is ready
    with pytest.raises(ValueError, match="pass one or the other"):
        with rollout_context(ready, "at-2"):
            pass


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rollout_id": ""}, "rollout_id must be a non-empty string"),
        ({"rollout_id": "ro", "attempt_id": ""}, "attempt_id must be a non-empty string or None"),
        ({"rollout_id": "ro", "endpoint": "ftp://x"}, "http\\(s\\) base URL"),
    ],
)
def test_rollout_context_validates(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RolloutContext(**kwargs)  # type: ignore[arg-type]


def test_endpoint_forms_and_the_key_stays_out_of_repr() -> None:
    for given in ("http://h:4000", "http://h:4000/", "http://h:4000/v1", "http://h:4000/v1/"):
        assert normalize_endpoint(given) == "http://h:4000"
    assert normalize_endpoint("https://h/prefix/v1") == "https://h/prefix"
    assert "sk-secret" not in repr(RolloutContext("ro", api_key="sk-secret"))
