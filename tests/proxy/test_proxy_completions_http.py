"""Raw HTTP `POST /v1/completions`: token-id prompts (the vLLM protocol remote samplers speak) and text."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from proxy_helpers import MODEL, auth, stored_calls
from shared_helpers import new_id

from agl_bridge import semconv


def _post(server: Any, body: dict[str, Any], rollout_id: str | None = None) -> httpx.Response:
    headers = auth(server)
    if rollout_id is not None:
        headers |= {"x-rollout-id": rollout_id, "x-attempt-id": "at-1"}
    return httpx.post(f"{server.base_url}/v1/completions", json=body, headers=headers, timeout=60)


def test_token_id_prompt_is_consumed_as_given(proxy_server: Any, tiny_tokenizer: Any) -> None:
    rid = new_id("ids")
    # Ids a tokenizer would never produce for any text (a byte-by-byte spelling, then a special token).
    prompt = [72, 105, 33, 1, 300, 7, 2]
    request = {"model": MODEL, "prompt": prompt, "max_tokens": 6, "seed": 3, "return_token_ids": True, "logprobs": 0}
    response = _post(proxy_server, request, rid)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "text_completion" and body["model"] == MODEL
    (choice,) = body["choices"]
    (call,) = stored_calls(proxy_server, rid, "at-1")
    assert choice["prompt_token_ids"] == prompt == call.prompt_token_ids
    assert choice["token_ids"] == call.response_token_ids and 1 <= len(choice["token_ids"]) <= 6
    assert choice["text"] == tiny_tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
    assert choice["logprobs"]["token_logprobs"] == call.response_logprobs
    assert choice["token_policy_versions"] == call.token_policy_versions
    assert choice["finish_reason"] == call.finish_reason
    produced = len(choice["token_ids"])
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": produced, "total_tokens": 7 + produced}
    assert call.messages == []
    (served,) = proxy_server.sampler.served_for(prompt)  # the sampler consumed exactly these ids, once
    assert served[3].sequences[0].tokens == call.response_token_ids


def test_text_prompt_is_tokenized_without_special_tokens(proxy_server: Any, tiny_tokenizer: Any) -> None:
    rid = new_id("text")
    text = f"[{rid}] Once upon a time"
    response = _post(proxy_server, {"model": MODEL, "prompt": text, "max_tokens": 4, "return_token_ids": True}, rid)
    assert response.status_code == 200, response.text
    (choice,) = response.json()["choices"]
    (call,) = stored_calls(proxy_server, rid)
    assert call.prompt_token_ids == tiny_tokenizer.encode(text, add_special_tokens=False) == choice["prompt_token_ids"]
    assert "token_ids" in choice
    plain = _post(proxy_server, {"model": MODEL, "prompt": text, "max_tokens": 1}).json()["choices"][0]
    assert "token_ids" not in plain and "prompt_token_ids" not in plain


def test_several_prompts_and_n_give_every_choice(proxy_server: Any) -> None:
    rid = new_id("batch")
    prompts = [[5, 6, 7], [8, 9]]
    response = _post(
        proxy_server, {"model": MODEL, "prompt": prompts, "n": 2, "max_tokens": 3, "return_token_ids": True}, rid
    )
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert [c["prompt_token_ids"] for c in choices] == [prompts[0], prompts[0], prompts[1], prompts[1]]
    calls = stored_calls(proxy_server, rid)
    assert sorted((tuple(c.prompt_token_ids), c.choice_index) for c in calls) == [
        ((5, 6, 7), 0),
        ((5, 6, 7), 1),
        ((8, 9), 0),
        ((8, 9), 1),
    ]
    assert sorted(tuple(c.response_token_ids) for c in calls) == sorted(tuple(c["token_ids"]) for c in choices)


def test_a_call_its_caller_records_is_served_but_not_stored_twice(proxy_server: Any) -> None:
    # A RemoteSampler in a front proxy sends this header: the front stores the call, with its messages
    # and rollout, so this server serving the tokens must not store a second copy.
    rid = new_id("upstream")
    headers = auth(proxy_server) | {"x-rollout-id": rid, semconv.HEADER_RECORDED_UPSTREAM: "1"}
    body = {"model": MODEL, "prompt": [21, 22, 23], "max_tokens": 3, "return_token_ids": True}
    response = httpx.post(f"{proxy_server.base_url}/v1/completions", json=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["token_ids"]
    assert stored_calls(proxy_server, rid) == []
    assert _post(proxy_server, body, rid).status_code == 200  # without the header: stored as usual
    assert len(stored_calls(proxy_server, rid)) == 1


def test_stop_token_ids_and_ignore_eos_reach_the_sampler(proxy_server: Any) -> None:
    prompt = [11, 12, 13, 14, 15]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 5, "stop_token_ids": [99], "ignore_eos": True, "top_k": 5}
    response = _post(proxy_server, body)
    assert response.status_code == 200, response.text
    params = proxy_server.sampler.served_for(prompt)[-1][2]
    assert params.stop == [99] and params.top_k == 5 and params.max_tokens == 5


def test_null_sampling_fields_take_the_endpoints_defaults(proxy_server: Any) -> None:
    # OpenAI's spec: max_tokens "integer or null, defaults to 16". A null read as "up to the window" sampled
    # 65k tokens of the tiny model's context: minutes, where the client asked for the default.
    prompt = [21, 22, 23]
    nulls = {"max_tokens": None, "temperature": None, "top_p": None, "top_k": None}
    response = _post(proxy_server, {"model": MODEL, "prompt": prompt, **nulls})
    assert response.status_code == 200, response.text
    params = proxy_server.sampler.served_for(prompt)[-1][2]
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k) == (16, 1.0, 1.0, -1)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "prompt": [1, 2, 10**6]}, "prompt"),
        ({"model": MODEL, "prompt": []}, "prompt"),
        ({"model": MODEL, "prompt": [[1], "x", 5]}, "prompt"),
        ({"model": MODEL, "prompt": [1, 2], "max_tokens": 0}, "max_tokens"),
        ({"model": MODEL, "prompt": [1, 2], "n": 0}, "n"),
        ({"model": MODEL, "prompt": [1, 2], "stop_token_ids": "x"}, "stop_token_ids"),
        ({"model": "nope", "prompt": [1, 2]}, "model"),
        ({"model": MODEL, "prompt": [1] * 70000}, "prompt"),
    ],
    ids=["id-out-of-vocab", "empty", "mixed", "max_tokens", "n", "stop_token_ids", "model", "too-long"],
)
def test_bad_completions_requests_name_the_field(proxy_server: Any, body: dict[str, Any], param: str) -> None:
    response = _post(proxy_server, body)
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert error["param"] == param and error["message"]
