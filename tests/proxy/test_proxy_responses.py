"""The Responses API's stored responses: `previous_response_id` continues the recorded call (its prompt and
response are the history, token for token), retrieval answers the record, and the rest is a 404 or 501."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from proxy_helpers import MODEL, auth, stored_calls
from shared_helpers import new_id

from agl_bridge.proxy.request import RolloutRoute
from agl_bridge.proxy.responses import PriorTurns, call_id, key_of, unique_start


def _client(server: Any, rollout_id: str | None) -> openai.OpenAI:
    base = server.openai_base_url(rollout_id, "a1") if rollout_id else server.openai_base_url()
    return openai.OpenAI(base_url=base, api_key=server.api_key, max_retries=0)


def _text(client: openai.OpenAI, stream: bool, **kwargs: Any) -> tuple[str, str]:
    """(response id, output text) of one Responses call, streamed or not."""
    if not stream:
        response = client.responses.create(model=MODEL, max_output_tokens=6, **kwargs)
        return response.id, response.output_text
    events = list(client.responses.create(model=MODEL, max_output_tokens=6, stream=True, **kwargs))
    done = [e for e in events if e.type in ("response.completed", "response.incomplete")]
    assert len(done) == 1, [e.type for e in events]
    return done[0].response.id, done[0].response.output_text


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("in_rollout", [True, False], ids=["rollout", "no-rollout"])
def test_previous_response_id_continues_the_recorded_call(proxy_server: Any, stream: bool, in_rollout: bool) -> None:
    rid = new_id("prev") if in_rollout else None
    client = _client(proxy_server, rid)
    first_id, first_text = _text(client, stream, input=f"first turn {new_id('t')}", instructions="Be brief.")
    second_id, _ = _text(client, stream, input="second", instructions="Be brief.", previous_response_id=first_id)
    _text(client, stream, input="third", previous_response_id=second_id)  # no instructions: the stored ones stay
    if rid is None:
        return  # found outside rollouts too (no 404); the records are checked in a rollout
    first, second, third = stored_calls(proxy_server, rid, "a1")
    assert second.messages[:2] == first.messages and second.messages[2]["content"] == first_text
    assert second.messages[3] == {"role": "user", "content": "second"}
    assert third.messages[:4] == second.messages and third.messages[-1] == {"role": "user", "content": "third"}
    for before, after in ((first, second), (second, third)):  # each prompt extends the last prompt + response
        sampled = before.prompt_token_ids + before.response_token_ids
        assert after.prompt_token_ids[: len(sampled)] == sampled
        assert after.prefix_breaks == []


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("unknown", ["resp_nope", "resp_" + "A" * 300, "chatcmpl-agl-e30", "%%"])
def test_an_unknown_previous_response_id_is_a_404_naming_it(proxy_server: Any, stream: bool, unknown: str) -> None:
    rid = new_id("prev404")
    refused = httpx.post(
        f"{proxy_server.base_url}/rollout/{rid}/attempt/a1/v1/responses",
        json={"model": MODEL, "input": "hi", "previous_response_id": unknown, "stream": stream},
        headers=auth(proxy_server),
        timeout=60,
    )
    assert refused.status_code == 404, refused.text[:300]
    error = refused.json()["error"]
    assert (error["param"], error["code"]) == ("previous_response_id", "not_found")
    assert stored_calls(proxy_server, rid) == []


def test_a_stored_response_is_retrieved_and_the_rest_refused(proxy_server: Any) -> None:
    rid = new_id("get")
    client = _client(proxy_server, rid)
    created = client.responses.create(model=MODEL, input="hello", max_output_tokens=5)
    fetched = client.responses.retrieve(created.id)
    assert (fetched.id, fetched.output_text, fetched.model) == (created.id, created.output_text, MODEL)
    assert fetched.usage is not None and created.usage is not None
    assert fetched.usage.output_tokens == created.usage.output_tokens
    base = f"{proxy_server.base_url}/rollout/{rid}/attempt/a1/v1/responses"
    for method, suffix, status in [
        ("DELETE", "", 501),
        ("POST", "/cancel", 501),
        ("GET", "/input_items", 501),
        ("PUT", "", 405),
    ]:
        answered = httpx.request(method, f"{base}/{created.id}{suffix}", headers=auth(proxy_server))
        assert answered.status_code == status, (method, suffix, answered.text[:200])
        assert answered.json()["error"]["code"] == ("unsupported" if status == 501 else "method_not_allowed")
    for unknown in ("resp_nope", "x" * 500, "resp_%25%25"):
        for method, suffix in [("GET", ""), ("DELETE", ""), ("POST", "/cancel")]:
            answered = httpx.request(method, f"{base}/{unknown}{suffix}", headers=auth(proxy_server))
            assert answered.status_code == 404, (method, unknown, answered.text[:200])
            assert answered.json()["error"]["param"] == "response_id"


def test_call_ids_name_their_call() -> None:
    started = unique_start()
    assert unique_start() > started  # unique within the process
    key = key_of(call_id(RolloutRoute("ro-1", "at-1"), started))
    assert key is not None and (key.rollout_id, key.attempt_id, key.started) == ("ro-1", "at-1", started)
    assert key_of(call_id(RolloutRoute(), started)) is not None
    for junk in ("", "resp_", "chatcmpl-agl-", "chatcmpl-agl-W10", "chatcmpl-agl-WzEsMiwzXQ", "resp_$$$"):
        assert key_of(junk) is None


def test_prior_turns_replace_instructions_and_answer_the_last_tool_calls() -> None:
    call = {"id": "call_old", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    prior = PriorTurns(
        [
            {"role": "system", "content": "old rules"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
        ],
        replace_instructions=True,
    )
    new = [{"role": "system", "content": "new rules"}, {"role": "tool", "content": "42", "tool_call_id": "call_new"}]
    assert prior.before(new) == [
        {"role": "system", "content": "new rules"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [{**call, "id": "call_new"}]},
        {"role": "tool", "content": "42", "tool_call_id": "call_new"},
    ]
    kept = PriorTurns(prior.messages, replace_instructions=False).before([{"role": "user", "content": "next"}])
    assert kept == [*prior.messages, {"role": "user", "content": "next"}]
