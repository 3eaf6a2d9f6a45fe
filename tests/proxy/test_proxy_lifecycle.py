"""The rollout lifecycle over HTTP: start, reward and finish with their refusals, and the Python helpers."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from proxy_helpers import MODEL, stored_rewards
from shared_helpers import ROLLOUT_ENV_VARS, new_id

from agl_bridge import finish_rollout, semconv, start_rollout
from agl_bridge.convert import ConversionReport, convert_store
from agl_bridge.tracing import LifecycleError


@pytest.fixture(autouse=True)
def _no_rollout_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ROLLOUT_ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def post(server: Any, rid: str, aid: str, route: str, body: Any = None, *, key: str | None = None) -> httpx.Response:
    url = f"{server.base_url}/rollout/{rid}/attempt/{aid}/{route}"
    headers = {"Authorization": f"Bearer {key or server.api_key}"}
    return (
        httpx.post(url, json=body, headers=headers, timeout=30)
        if body is not None
        else httpx.post(url, headers=headers, timeout=30)
    )


def chat(server: Any, rid: str, aid: str) -> None:
    with openai.OpenAI(base_url=server.openai_base_url(rid, aid), api_key=server.api_key, max_retries=0) as client:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)


def rollout(server: Any, rid: str) -> Any:
    return server.run_coroutine(server.store.get_rollout(rid))


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_a_harness_drives_a_rollout_through_start_calls_reward_and_finish(proxy_server: Any) -> None:
    rid, aid = new_id("life"), "0"
    started = post(proxy_server, rid, aid, "start", {"task_id": "task-7", "metadata": {"n": 7}})
    assert started.status_code == 200, started.text
    answer = started.json()
    assert answer.pop("agent_key").startswith("agl-agent-")  # the key to give the agent instead of the operator's
    assert answer | {"attempts": 1} == {
        "rollout_id": rid, "attempt_id": aid, "status": "running", "task_id": "task-7", "eval": False,
        "attempts": 1, "origin": "external",
    }  # fmt: skip
    chat(proxy_server, rid, aid)
    rewarded = post(proxy_server, rid, aid, "reward", {"value": 1, "name": "correct"})
    assert rewarded.status_code == 200 and rewarded.json()["value"] == 1.0 and rewarded.json()["name"] == "correct"
    finished = post(proxy_server, rid, aid, "finish", {"status": "succeeded"})
    assert finished.status_code == 200 and finished.json()["status"] == "succeeded"
    stored = rollout(proxy_server, rid)
    assert (stored.group_id, stored.task, stored.origin.value) == ("task-7", {"n": 7}, "external")
    (reward,) = stored_rewards(proxy_server, rid, aid)
    assert reward.sequence is not None and reward.sequence > 0  # after the call it followed

    async def convert() -> list[Any]:
        return [t async for t in convert_store(proxy_server.store, rollout_ids=[rid], report=ConversionReport())]

    (trajectory,) = proxy_server.run_coroutine(convert())
    assert (trajectory.group_id, trajectory.reward, trajectory.task) == ("task-7", 1.0, {"n": 7})


def test_the_first_call_registers_the_rollout_and_an_attempt_id_may_repeat_across_rollouts(proxy_server: Any) -> None:
    first, second = new_id("first"), new_id("second")
    chat(proxy_server, first, "0")
    chat(proxy_server, second, "0")
    for rid in (first, second):
        stored = rollout(proxy_server, rid)
        assert (stored.status.value, stored.origin.value, stored.attempts, stored.group_id) == (
            "running", "external", 1, None,
        )  # fmt: skip
    named = post(proxy_server, second, "0", "finish", {"status": "failed", "error": "tool crashed", "task_id": "t"})
    assert named.status_code == 200 and named.json()["status"] == "failed" and named.json()["task_id"] == "t"
    attempt = proxy_server.run_coroutine(proxy_server.store.get_attempt("0", second))
    assert (attempt.status.value, attempt.error) == ("failed", "tool crashed")
    assert rollout(proxy_server, first).status.value == "running"


@pytest.mark.parametrize("value", ["1.0", None, True, float("nan"), float("inf"), [1], {"v": 1}])
def test_a_reward_that_is_not_a_finite_number_is_a_400_naming_value(proxy_server: Any, value: Any) -> None:
    rid = new_id("badvalue")
    body = (
        '{"value": NaN}'
        if value != value
        else ('{"value": Infinity}' if value == float("inf") else None)  # JSON has no literal for them
    )
    url = f"{proxy_server.base_url}/rollout/{rid}/attempt/0/reward"
    headers = {"Authorization": f"Bearer {proxy_server.api_key}", "Content-Type": "application/json"}
    response = (
        httpx.post(url, content=body, headers=headers, timeout=30)
        if body is not None
        else httpx.post(url, json={"value": value}, headers=headers, timeout=30)
    )
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["param"] == "value" and "finite number" in error["message"]
    assert rollout(proxy_server, rid) is None  # nothing was registered by a refused request


def test_finishing_twice_or_an_unknown_attempt_and_rewarding_a_finished_one_are_refused(proxy_server: Any) -> None:
    rid = new_id("twice")
    assert post(proxy_server, rid, "a", "start").status_code == 200
    assert post(proxy_server, rid, "a", "finish", {"status": "succeeded"}).status_code == 200
    again = post(proxy_server, rid, "a", "finish", {"status": "failed"})
    assert again.status_code == 409 and error_of(again)["code"] == "conflict"
    assert "'a'" in error_of(again)["message"] and "already finished (succeeded)" in error_of(again)["message"]
    late = post(proxy_server, rid, "a", "reward", {"value": 1.0})
    assert late.status_code == 409 and "report rewards before finishing" in error_of(late)["message"]
    assert stored_rewards(proxy_server, rid, "a") == []  # never silently attached elsewhere
    unknown = post(proxy_server, new_id("nobody"), "x", "finish", {"status": "succeeded"})
    assert unknown.status_code == 404 and error_of(unknown)["param"] == semconv.HEADER_ATTEMPT_ID
    assert "no attempt 'x'" in error_of(unknown)["message"]
    restart = post(proxy_server, rid, "b", "start")
    assert restart.status_code == 409 and "new rollout id" in error_of(restart)["message"]


def test_a_rollout_id_reused_for_another_task_is_a_409(proxy_server: Any) -> None:
    rid = new_id("reuse")
    assert post(proxy_server, rid, "0", "start", {"task_id": "t-1"}).status_code == 200
    other = post(proxy_server, rid, "0", "finish", {"status": "succeeded", "task_id": "t-2"})
    assert other.status_code == 409 and error_of(other)["param"] == "task_id"
    assert "'t-1', not 't-2'" in error_of(other)["message"]
    assert rollout(proxy_server, rid).status.value == "running"  # the refused finish changed nothing


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("finish", {"status": "done"}, "status"),
        ("finish", {}, "status"),
        ("finish", {"status": "failed", "error": 3}, "error"),
        ("start", {"task_id": ""}, "task_id"),
        ("start", {"eval": "yes"}, "eval"),
        ("reward", {"value": 1.0, "name": ""}, "name"),
        ("reward", [1.0], "request_body"),
    ],
)
def test_bad_bodies_are_400s_naming_the_field(proxy_server: Any, route: str, body: Any, param: str) -> None:
    response = post(proxy_server, new_id("bad"), "0", route, body)
    assert response.status_code == 400, response.text
    assert error_of(response)["param"] == param


def test_lifecycle_routes_need_the_key_and_a_rollout(proxy_server: Any) -> None:
    assert post(proxy_server, new_id("key"), "0", "start", key="wrong").status_code == 401
    bare = httpx.post(
        f"{proxy_server.base_url}/finish",
        json={"status": "succeeded"},
        headers={"Authorization": f"Bearer {proxy_server.api_key}"},
        timeout=30,
    )
    assert bare.status_code == 400 and error_of(bare)["param"] == semconv.HEADER_ROLLOUT_ID
    rid = new_id("headers")  # the routing headers work as the path prefix does
    by_headers = httpx.post(
        f"{proxy_server.base_url}/start",
        json={"eval": True},
        headers={
            "Authorization": f"Bearer {proxy_server.api_key}",
            semconv.HEADER_ROLLOUT_ID: rid,
            semconv.HEADER_ATTEMPT_ID: "0",
        },
        timeout=30,
    )
    assert by_headers.status_code == 200 and by_headers.json()["eval"] is True


def test_python_helpers_start_and_finish_over_http(proxy_server: Any) -> None:
    rid = new_id("helpers")
    where = {"rollout_id": rid, "attempt_id": "1", "endpoint": proxy_server.base_url, "api_key": proxy_server.api_key}
    assert start_rollout("task-h", eval=True, **where)["eval"] is True
    chat(proxy_server, rid, "1")
    done = finish_rollout("succeeded", **where)
    assert (done["status"], done["task_id"]) == ("succeeded", "task-h")
    with pytest.raises(LifecycleError) as refused:
        finish_rollout("failed", **where)
    assert refused.value.status == 409 and "already finished" in str(refused.value)
