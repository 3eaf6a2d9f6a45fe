"""Sampling from `sampler_weights` saved by an earlier server process: the unmodified `tinker` SDK trains a
LoRA (with the unembedding, the SDK's default) on one server, saves it for sampling, and a new server over
the same root samples the same tokens and logprobs from the path; bad paths are refused as SDK errors.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import tinker
from tinker import types

from agl_bridge.proxy.server import bind_socket
from agl_bridge.tinker_api.server import TinkerServer

os.environ.setdefault("TINKER_TELEMETRY", "0")

pytestmark = pytest.mark.slow

RECIPE_NAME = "Qwen/Qwen3-8B"
GREEDY = types.SamplingParams(max_tokens=8, temperature=0.0)
SEEDED = types.SamplingParams(max_tokens=8, temperature=1.0, seed=7)


def _server(root: Path) -> TinkerServer:
    return TinkerServer(bind_socket("127.0.0.1", 0), root, models={RECIPE_NAME: "tiny"}, poll_s=1.0)


def _datum(tokens: list[int]) -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [0.0] + [1.0] * (len(tokens) - 2)},
    )


def _samples(client: tinker.SamplingClient, prompt: list[int]) -> list[tuple[list[int], list[float]]]:
    found = []
    for params in (GREEDY, SEEDED):
        sequence = client.sample(types.ModelInput.from_ints(prompt), num_samples=1, sampling_params=params)
        sequence = sequence.result().sequences[0]
        assert sequence.logprobs is not None
        found.append((list(sequence.tokens), list(sequence.logprobs)))
    return found


def _assert_same(found: list[tuple[list[int], list[float]]], expected: list[tuple[list[int], list[float]]]) -> None:
    for (tokens, logprobs), (expected_tokens, expected_logprobs) in zip(found, expected, strict=True):
        assert tokens == expected_tokens
        assert np.allclose(logprobs, expected_logprobs, atol=1e-5)


def test_a_new_server_samples_sampler_weights_saved_by_an_earlier_one(tmp_path: Path) -> None:
    with _server(tmp_path) as first, tinker.ServiceClient(base_url=first.base_url, api_key=first.api_key) as service:
        training = service.create_lora_training_client(base_model=RECIPE_NAME, rank=4, seed=2).result()
        tokens = training.get_tokenizer().encode("Let's play a game. Say you are 42. I'm 42.")
        for _ in range(2):
            training.forward_backward([_datum(tokens)], "cross_entropy").result()
            training.optim_step(types.AdamParams(learning_rate=5e-2)).result()
        path = training.save_weights_for_sampler("w1").result().path
        prompt = tokens[:6]
        before = _samples(service.create_sampling_client(model_path=path).result(), prompt)
        base = _samples(service.create_sampling_client(base_model=RECIPE_NAME).result(), prompt)
        state = training.save_state("s1").result().path
    assert before != base, "training moved the weights (the comparison below would be vacuous otherwise)"

    with _server(tmp_path) as second, tinker.ServiceClient(base_url=second.base_url, api_key=second.api_key) as service:
        stored = service.create_sampling_client(model_path=path).result()
        _assert_same(_samples(stored, prompt), before)
        assert stored.get_base_model() == RECIPE_NAME
        sampler = tinker.RestClient(base_url=second.base_url, api_key=second.api_key).get_sampler(
            stored._sampling_session_id  # the SDK keeps the session id private; GET samplers/{id} answers it
        )
        assert sampler.result().model_path == path
        # The base model's own sessions keep the base weights.
        _assert_same(_samples(service.create_sampling_client(base_model=RECIPE_NAME).result(), prompt), base)
        # A run made after the restart gets a new id: it cannot write over the earlier run's checkpoints.
        assert (
            service.create_lora_training_client(base_model=RECIPE_NAME, rank=4).result().model_id != training.model_id
        )

        missing = path.replace("/w1", "/no-such")
        with pytest.raises(tinker.BadRequestError, match="no-such") as refused:
            service.create_sampling_client(model_path=missing).result()
        assert "no checkpoint" in str(refused.value)
        with pytest.raises(tinker.BadRequestError, match="training state"):
            service.create_sampling_client(model_path=state).result()
        (tmp_path / training.model_id / "sampler_weights" / "empty").mkdir()
        with pytest.raises(tinker.BadRequestError, match="not a LoRA adapter"):
            service.create_sampling_client(model_path=path.replace("/w1", "/empty")).result()
