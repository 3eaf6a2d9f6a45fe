"""The remote sampler's pieces on their own: the request body, the checks on an answer, and routing."""

from __future__ import annotations

import re

import pytest

from agl_bridge.sampler.base import SamplingParams
from agl_bridge.sampler.remote_errors import ServerFailure
from agl_bridge.sampler.remote_pool import ServerPool
from agl_bridge.sampler.remote_protocol import (
    completion_body,
    parse_completion,
    parse_prompt_logprobs,
    served_context_window,
)

URL = "http://gpu-1:8000"


def _answer(**choice: object) -> dict:
    base = {
        "index": 0,
        "text": "",
        "token_ids": [7, 8],
        "prompt_token_ids": [1, 2],
        "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.5, -1.5]},
        "finish_reason": "stop",
    }
    return {"choices": [{**base, **choice}]}


def test_the_body_maps_our_stop_semantics_onto_vllms() -> None:
    default = completion_body("m-v3", [1, 2], SamplingParams(max_tokens=5, seed=4), 2, context_window=64)
    assert default["model"] == "m-v3" and default["prompt"] == [1, 2] and default["n"] == 2 and default["seed"] == 4
    assert default["return_token_ids"] is True and default["logprobs"] == 0 and default["top_k"] == -1
    assert "stop" not in default and "ignore_eos" not in default, "stop=None: the server's end-of-sequence ids"
    explicit = completion_body("m", [1], SamplingParams(stop=[9, "END"], top_k=5), 1, context_window=64)
    assert explicit["ignore_eos"] is True and explicit["stop_token_ids"] == [9] and explicit["stop"] == ["END"]
    assert explicit["top_k"] == 5
    never = completion_body("m", [1], SamplingParams(stop=[], max_tokens=5), 1, context_window=64)
    assert never["ignore_eos"] is True and never["stop_token_ids"] == [] and never["max_tokens"] == 5


def test_max_tokens_none_asks_for_the_rest_of_the_context_window_never_null() -> None:
    # Regression: `max_tokens: null` made vLLM sample its default of 16 tokens, not "to the context window".
    body = completion_body("m", [1, 2, 3], SamplingParams(max_tokens=None), 1, context_window=64)
    assert body["max_tokens"] == 61
    capped = completion_body("m", [1, 2, 3], SamplingParams(max_tokens=500), 1, context_window=64)
    assert capped["max_tokens"] == 61, "never past the window: our own sampler stops there with 'length'"


def test_the_context_window_is_read_from_the_servers_model_list() -> None:
    vllm_list = {
        "data": [
            {"id": "qwen", "parent": None, "max_model_len": 8192},
            {"id": "qwen-v3", "parent": "qwen", "max_model_len": 8192},
        ]
    }
    assert served_context_window(vllm_list, "qwen") == 8192
    assert served_context_window({"data": [{"id": "base", "parent": None, "max_model_len": 512}]}, "other") == 512
    assert served_context_window({"data": [{"id": "tiny", "object": "model"}]}, "tiny") == 0, "LiteLLM's list"
    assert served_context_window("not json", "tiny") == 0


def test_an_answer_is_taken_as_it_is() -> None:
    result = parse_completion(URL, _answer(), [1, 2], 1, version=3)
    (sequence,) = result.sequences
    assert sequence.tokens == [7, 8] and sequence.logprobs == [-0.5, -1.5] and sequence.stop_reason == "stop"
    assert sequence.token_policy_versions == [3, 3]
    ours = parse_completion(URL, _answer(token_policy_versions=[3, 4]), [1, 2], 1, version=3)
    assert ours.sequences[0].token_policy_versions == [3, 4], "agl-bridge serve reports each token's version"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"token_ids": None}, "without choices[0].token_ids"),
        ({"prompt_token_ids": [1, 2, 3]}, "differ from the prompt ids sent"),
        ({"logprobs": {"tokens": ["a", "b"]}}, "token_logprobs for each of its 2 token_ids"),
        ({"logprobs": {"token_logprobs": [-0.5]}}, "got 1 values"),
        ({"finish_reason": "abort"}, "finish_reason is 'abort'"),
    ],
)
def test_an_answer_missing_what_we_train_on_is_refused_naming_it(change: dict, words: str) -> None:
    with pytest.raises(ServerFailure, match=re.escape(words)) as caught:
        parse_completion(URL, _answer(**change), [1, 2], 1, version=0)
    assert caught.value.url == URL


def test_wrong_number_of_choices_and_prompt_logprobs() -> None:
    with pytest.raises(ServerFailure, match="1 choices for n=2"):
        parse_completion(URL, _answer(), [1, 2], 2, version=0)
    answer = {
        "choices": [
            {"index": 0, "prompt_logprobs": [None, {"5": {"logprob": -0.25, "rank": 1}}, {"6": {"logprob": -2.0}}]}
        ]
    }
    assert parse_prompt_logprobs(URL, answer, [4, 5, 6]) == [None, -0.25, -2.0]
    with pytest.raises(ServerFailure, match="prompt_logprobs"):
        parse_prompt_logprobs(URL, answer, [4, 5, 7])


def test_rendezvous_routing_moves_only_the_rollouts_of_a_server_that_leaves() -> None:
    pool = ServerPool([f"http://s{i}:8000" for i in range(4)], cooldown_s=60)
    keys = [f"ro-{i}" for i in range(200)]
    before = {key: pool.order(key)[0].url for key in keys}
    assert len(set(before.values())) == 4
    gone = pool.servers[1]
    pool.mark_down(gone, "connection refused")
    after = {key: pool.order(key)[0].url for key in keys}
    moved = {key for key in keys if before[key] != after[key]}
    assert moved == {key for key in keys if before[key] == gone.url}
    assert all(pool.order(key)[-1] is gone for key in keys), "a down server is tried last, not never"
    pool.mark_up(gone)
    assert {key: pool.order(key)[0].url for key in keys} == before
