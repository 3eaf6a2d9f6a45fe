"""`/v1/completions` as OpenAI's clients use it: `stream: true` honoured in OpenAI's chunk shape, unknown or
unhonoured fields refused naming the field."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from proxy_helpers import MODEL, auth, stored_calls
from shared_helpers import new_id


def _client(server: Any, rollout_id: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.openai_base_url(rollout_id, "a1"), api_key=server.api_key, max_retries=0)


@pytest.mark.parametrize("prompt", ["Once upon a time", [72, 105, 33, 300, 7]], ids=["text", "token-ids"])
def test_a_streamed_completion_reads_as_the_openai_client_expects(
    proxy_server: Any, tiny_tokenizer: Any, prompt: Any
) -> None:
    rid = new_id("cmpl-stream")
    stream = _client(proxy_server, rid).completions.create(
        model=MODEL, prompt=prompt, max_tokens=12, seed=5, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    *texts, usage_chunk = chunks
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert all(chunk.object == "text_completion" and len(chunk.choices) == 1 for chunk in texts)
    assert len({chunk.id for chunk in chunks}) == 1
    assert [c.choices[0].finish_reason for c in texts[:-1]] == [None] * (len(texts) - 1)
    (call,) = stored_calls(proxy_server, rid, "a1")
    assert texts[-1].choices[0].finish_reason == call.finish_reason
    text = "".join(chunk.choices[0].text for chunk in texts)
    assert text == tiny_tokenizer.decode(call.response_token_ids, skip_special_tokens=True)
    assert usage_chunk.usage.completion_tokens == len(call.response_token_ids)
    assert usage_chunk.usage.prompt_tokens == len(call.prompt_token_ids)


def test_streamed_ids_and_logprobs_are_the_recorded_ones(proxy_server: Any) -> None:
    rid = new_id("cmpl-ids")
    body = {
        "model": MODEL,
        "prompt": [[72, 105], [33, 300]],
        "n": 2,
        "max_tokens": 6,
        "stream": True,
        "logprobs": 0,
        "return_token_ids": True,
    }
    with httpx.stream(
        "POST",
        f"{proxy_server.base_url}/rollout/{rid}/attempt/a1/v1/completions",
        json=body,
        headers=auth(proxy_server),
        timeout=60,
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    ids: dict[int, list[int]] = {}
    logprobs: dict[int, list[float]] = {}
    for event in events[:-1]:
        (choice,) = json.loads(event)["choices"]
        ids.setdefault(choice["index"], []).extend(choice["token_ids"])
        logprobs.setdefault(choice["index"], []).extend(choice["logprobs"]["token_logprobs"])
    calls = stored_calls(proxy_server, rid, "a1")
    assert sorted(ids) == [0, 1, 2, 3] and len(calls) == 4
    recorded = sorted((c.response_token_ids, c.response_logprobs) for c in calls)
    assert sorted((ids[i], logprobs[i]) for i in ids) == recorded


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"frobnicate": 1}, "frobnicate"),
        ({"echo": True}, "echo"),
        ({"best_of": 3}, "best_of"),
        ({"suffix": "end"}, "suffix"),
        ({"logit_bias": {"5": 1}}, "logit_bias"),
        ({"stream": "yes"}, "stream"),
        ({"stream": True, "stream_options": []}, "stream_options"),
        # a truthy string would have asked for a sample as long as the context window
        ({"ignore_eos": "(/Av", "max_tokens": 10**20}, "ignore_eos"),
        ({"return_token_ids": 1}, "return_token_ids"),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_unknown_and_unhonoured_fields_are_refused_by_name(
    proxy_server: Any, extra: dict[str, Any], param: str, stream: bool
) -> None:
    rid = new_id("cmpl-bad")
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "stream": stream, **extra}
    refused = httpx.post(
        f"{proxy_server.base_url}/rollout/{rid}/attempt/a1/v1/completions", json=body, headers=auth(proxy_server)
    )
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == param
    assert stored_calls(proxy_server, rid) == []


def test_the_fields_openai_clients_send_by_default_are_accepted(proxy_server: Any) -> None:
    body = {
        "model": MODEL,
        "prompt": "hi",
        "max_tokens": 2,
        "temperature": 0.7,
        "top_p": 1,
        "n": 1,
        "best_of": 1,
        "echo": False,
        "logit_bias": {},
        "presence_penalty": 0,
        "frequency_penalty": 0,
        "seed": None,
        "user": "someone",
    }
    answered = httpx.post(f"{proxy_server.base_url}/v1/completions", json=body, headers=auth(proxy_server))
    assert answered.status_code == 200, answered.text
