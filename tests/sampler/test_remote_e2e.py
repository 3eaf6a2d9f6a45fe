"""End to end on CPU: `agl-bridge serve --sampler remote` (a subprocess) in front of a real second
`agl-bridge serve`, reached through relays in the test process that can be told to misbehave.

An agent's chat call through the front proxy gets the exact ids the second server sampled, the
front records them, the calls of one rollout stay on one server, and when the server answers without
token ids the call fails (503 naming the server) and nothing is recorded.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import openai
import pytest
from remote_helpers import KEY, FakeServer, recorded_calls, serving

from agl_bridge import semconv

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def relays(remote_target):
    servers = [FakeServer(mode="relay", relay_to=remote_target.url, relay_key=KEY) for _ in range(2)]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def front(relays, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    with serving(
        tiny_model_dir,
        tmp_path_factory.mktemp("front") / "front.sqlite",
        "--sampler",
        "remote",
        "--sampler-url",
        ",".join(r.url for r in relays),
        "--sampler-api-key",
        KEY,
        "--sampler-timeout",
        "20",
    ) as server:
        yield server


def _client(front, rollout: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{front.url}/rollout/{rollout}/attempt/a1/v1", api_key=KEY, max_retries=0)


def test_chat_through_the_front_gets_and_records_the_second_servers_exact_ids(front, relays, remote_target) -> None:
    for relay in relays:
        relay.mode = "relay"
    rollout = f"ro-{uuid.uuid4().hex[:8]}"
    reply = _client(front, rollout).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=8,
        seed=7,
        extra_body={"return_token_ids": True},
    )
    prompt_ids = reply.model_extra["prompt_token_ids"]
    token_ids = reply.choices[0].model_extra["token_ids"]
    sent = [r for relay in relays for r in relay.requests if r.get("prompt") == prompt_ids]
    assert len(sent) == 1 and sent[0]["seed"] == 7 and sent[0]["return_token_ids"] is True
    sent_headers = [
        h
        for relay in relays
        for r, h in zip(relay.requests, relay.headers, strict=False)
        if r.get("prompt") == prompt_ids
    ]
    assert sent_headers[0].get(semconv.HEADER_RECORDED_UPSTREAM) == "1", (
        "the front records the call, not the sampler server"
    )
    direct = httpx.post(
        f"{remote_target.url}/v1/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=60,
        json={k: v for k, v in sent[0].items() if k != "path"},
    ).json()["choices"][0]
    assert token_ids == direct["token_ids"]
    (call,) = recorded_calls(front.store, rollout)
    assert call.prompt_token_ids == prompt_ids and call.response_token_ids == token_ids
    assert list(call.response_logprobs) == direct["logprobs"]["token_logprobs"]


def test_calls_of_one_rollout_stay_on_one_server_through_the_proxy(front, relays, tiny_tokenizer) -> None:
    for relay in relays:
        relay.mode = "relay"
        relay.requests.clear()
    rollouts = [f"ro-aff{i}-{uuid.uuid4().hex[:6]}" for i in range(8)]
    for rollout in rollouts:
        client = _client(front, rollout)
        for turn in range(2):
            client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": f"{rollout} turn {turn}"}], max_tokens=2
            )
    homes: dict[str, set[int]] = {}
    for index, relay in enumerate(relays):
        for request in relay.requests:
            text = tiny_tokenizer.decode(request["prompt"])
            for rollout in rollouts:
                if rollout in text:
                    homes.setdefault(rollout, set()).add(index)
    assert set(homes) == set(rollouts) and all(len(h) == 1 for h in homes.values()), homes
    assert {next(iter(h)) for h in homes.values()} == {0, 1}, "rollouts spread over both servers"


def test_a_server_answering_without_ids_fails_the_call_and_records_nothing(front, relays) -> None:
    for relay in relays:
        relay.mode = "no_ids"
    rollout = f"ro-noids-{uuid.uuid4().hex[:8]}"
    try:
        with pytest.raises(openai.APIStatusError) as caught:
            _client(front, rollout).chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3
            )
    finally:
        for relay in relays:
            relay.mode = "relay"
    assert caught.value.status_code == 503
    message = str(caught.value)
    # LiteLLM masks IP addresses in errors it hands to clients; the ports still tell the servers apart
    # (the front's log and its /v1/completions errors carry the full URLs).
    assert "token_ids" in message and all(f":{relay.port}" in message for relay in relays)
    assert recorded_calls(front.store, rollout) == []
