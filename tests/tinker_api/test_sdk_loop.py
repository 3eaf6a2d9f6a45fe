"""The unmodified `tinker` SDK (0.38) against our Tinker API server, on the tiny model: its own training loop,
sampling (pinned snapshots, newest weights, base model), checkpoints and resume, REST calls, and refusals
that come back as the SDK's errors while the server stays up.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
import torch
from tinker import types

from agl_bridge.primitives import AdamParams, Datum, TrainingClient
from agl_bridge.proxy.server import bind_socket
from agl_bridge.tinker_api.server import TinkerServer

os.environ.setdefault("TINKER_TELEMETRY", "0")  # the SDK's own telemetry posts (to our server) are noise here

RECIPE_NAME = "Qwen/Qwen3-8B"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinkerServer]:
    root = tmp_path_factory.mktemp("tinker-root")
    # A 1 s poll: the SDK's "try again" path runs in every test whose call takes longer than that.
    with TinkerServer(bind_socket("127.0.0.1", 0), root, models={RECIPE_NAME: "tiny"}, poll_s=1.0) as running:
        yield running


@pytest.fixture(scope="module")
def service_client(server: TinkerServer) -> Iterator[tinker.ServiceClient]:
    # Leaving the block finishes the session (POST sessions/{id}/finish), as the cookbook's trainers do.
    with tinker.ServiceClient(base_url=server.base_url, api_key=server.api_key) as client:
        yield client


def _datum(tokens: list[int]) -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [0.0] + [1.0] * (len(tokens) - 2)},
    )


def _tokens(training: tinker.TrainingClient) -> list[int]:
    return training.get_tokenizer().encode("Let's play a game. Say you are 42. I'm 42.")


def test_the_sdk_loop_trains_like_our_client_in_process(service_client: tinker.ServiceClient) -> None:
    training = service_client.create_lora_training_client(base_model=RECIPE_NAME, rank=8, seed=3).result()
    info = training.get_info()
    assert info.model_data.model_name == RECIPE_NAME and info.lora_rank == 8
    assert Path(info.model_data.tokenizer_id).is_dir(), "the tokenizer is served from the local model"
    tokens = _tokens(training)
    adam = types.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-12)

    # The same steps in-process, with the SDK's LoRA settings (rank 8, seed 3, unembedding trained).
    local = TrainingClient("tiny", lora_rank=8, seed=3, train_unembedding=True)
    local_datum = Datum(tokens[:-1], {"target_tokens": tokens[1:], "weights": [0.0] + [1.0] * (len(tokens) - 2)})
    for _ in range(3):
        wire = training.forward_backward([_datum(tokens)], "cross_entropy").result()
        training.optim_step(adam).result()
        ours = local.forward_backward([local_datum], "cross_entropy")
        local.optim_step(AdamParams(learning_rate=1e-2, eps=1e-12, grad_clip_norm=None))
        assert wire.metrics["loss:sum"] == pytest.approx(ours.metrics["loss"], rel=1e-6)
        wire_logprobs = wire.loss_fn_outputs[0]["logprobs"].to_numpy()
        assert np.allclose(wire_logprobs, ours.loss_fn_outputs[0]["logprobs"].numpy(), atol=1e-6)
        assert all(key.count(":") == 1 for key in wire.metrics), "the SDK splits every metric key on ':'"
    local.close()

    # forward (no gradient) answers through the same route.
    forward = training.forward([_datum(tokens)], "cross_entropy").result()
    assert len(forward.loss_fn_outputs[0]["logprobs"].to_numpy()) == len(tokens) - 1


def test_forward_backward_custom_trains_like_our_custom_loss(service_client: tinker.ServiceClient) -> None:
    """The SDK runs a custom loss client-side and sends its gradient as signed cross-entropy weights."""
    training = service_client.create_lora_training_client(base_model=RECIPE_NAME, rank=4, seed=5).result()
    tokens = _tokens(training)

    def push_away(data: list, logprobs: list) -> tuple[torch.Tensor, dict[str, float]]:
        # Lower the logprob of the second half, raise the first: gradients of both signs.
        lp = logprobs[0]
        half = len(lp) // 2
        return lp[half:].sum() - lp[:half].sum(), {"custom:mean": 1.0}

    wire = training.forward_backward_custom([_datum(tokens)], push_away).result()
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    local = TrainingClient("tiny", lora_rank=4, seed=5, train_unembedding=True)
    local_datum = Datum(tokens[:-1], {"target_tokens": tokens[1:], "weights": [0.0] + [1.0] * (len(tokens) - 2)})
    ours = local.forward_backward_custom([local_datum], lambda data, logprobs: push_away(data, logprobs))
    local.optim_step(AdamParams(learning_rate=1e-2, eps=1e-12, grad_clip_norm=None))
    assert wire.metrics["loss:sum"] == pytest.approx(ours.metrics["loss"], rel=1e-5)
    after_wire = training.forward([_datum(tokens)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
    after_local = local.forward([local_datum], "cross_entropy").loss_fn_outputs[0]["logprobs"]
    local.close()
    assert np.allclose(after_wire.to_numpy(), after_local.numpy(), atol=1e-5)


def test_sampling_sessions_pin_their_snapshot_while_training_goes_on(service_client: tinker.ServiceClient) -> None:
    training = service_client.create_lora_training_client(base_model=RECIPE_NAME, rank=4).result()
    tokens = _tokens(training)
    pinned = training.save_weights_and_get_sampling_client().result()
    following = training.save_weights_and_get_sampling_client(kind="inflight").result()
    before = pinned.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
    for _ in range(2):
        training.forward_backward([_datum(tokens)], "cross_entropy").result()
        training.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    newer = training.save_weights_and_get_sampling_client().result()
    after_pinned = pinned.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
    after_newer = newer.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
    after_following = following.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
    assert after_pinned == before, "a snapshot samples with the weights it was saved with"
    assert after_newer != before, "training moved the weights"
    assert after_following == after_newer, "an inflight session follows the newest weights"

    # The sampler scores what it sampled as the trainer does (exact tokens, raw logprobs).
    prompt = types.ModelInput.from_ints(tokens[:8])
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=1)
    result = newer.sample(prompt, num_samples=3, sampling_params=params).result()
    assert len(result.sequences) == 3 and len({s.sequence_id for s in result.sequences}) == 3
    sequence = result.sequences[0]
    full = tokens[:8] + sequence.tokens
    scored = newer.compute_logprobs(types.ModelInput.from_ints(full)).result()
    assert np.allclose(scored[8:], sequence.logprobs, atol=1e-5)
    trained = training.forward([_datum(full)], "cross_entropy").result()
    assert np.allclose(trained.loss_fn_outputs[0]["logprobs"].to_numpy()[7:], sequence.logprobs, atol=1e-5)

    base = service_client.create_sampling_client(base_model=RECIPE_NAME).result()
    assert base.compute_logprobs(types.ModelInput.from_ints(tokens)).result() != after_newer


def test_checkpoints_resume_with_the_optimizer_and_list_and_delete(
    service_client: tinker.ServiceClient, server: TinkerServer
) -> None:
    training = service_client.create_lora_training_client(base_model=RECIPE_NAME, rank=4, seed=1).result()
    tokens = _tokens(training)
    adam = types.AdamParams(learning_rate=1e-2)
    training.forward_backward([_datum(tokens)], "cross_entropy").result()
    training.optim_step(adam).result()
    state = training.save_state("000001").result().path
    sampler_path = training.save_weights_for_sampler("000001").result().path
    assert state == f"tinker://{training.model_id}/weights/000001"
    assert sampler_path == f"tinker://{training.model_id}/sampler_weights/000001"

    resumed = service_client.create_training_client_from_state_with_optimizer(state).result()
    for client in (training, resumed):  # the same next step on both: weights and Adam moments were restored
        client.forward_backward([_datum(tokens)], "cross_entropy").result()
        client.optim_step(adam).result()
    original = training.forward([_datum(tokens)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
    restored = resumed.forward([_datum(tokens)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
    assert np.allclose(original.to_numpy(), restored.to_numpy(), atol=1e-6)

    from_path = service_client.create_sampling_client(model_path=sampler_path).result()
    assert (
        from_path.sample(
            types.ModelInput.from_ints(tokens[:4]), num_samples=1, sampling_params=types.SamplingParams(max_tokens=2)
        )
        .result()
        .sequences
    )

    rest = tinker.RestClient(base_url=server.base_url, api_key=server.api_key)
    listed = {c.checkpoint_id for c in rest.list_checkpoints(training.model_id).result().checkpoints}
    assert listed == {"weights/000001", "sampler_weights/000001"}
    run = rest.get_training_run(training.model_id).result()
    assert run.base_model == RECIPE_NAME and run.lora_rank == 4
    rest.delete_checkpoint(training.model_id, "weights/000001").result()
    assert {c.checkpoint_id for c in rest.list_checkpoints(training.model_id).result().checkpoints} == {
        "sampler_weights/000001"
    }


def test_refusals_come_back_as_the_sdks_errors_and_the_server_stays_up(
    service_client: tinker.ServiceClient, server: TinkerServer
) -> None:
    training = service_client.create_lora_training_client(base_model=RECIPE_NAME, rank=4).result()
    tokens = _tokens(training)
    for loss, message in (("grpo", "known losses"),):
        with pytest.raises(tinker.BadRequestError) as refused:
            training.forward_backward([_datum(tokens)], loss).result()
        assert refused.value.status_code == 400 and loss in str(refused.value) and message in str(refused.value)
    bad = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": [0.5] * (len(tokens) - 1),
            "advantages": [1.0] * (len(tokens) - 1),
        },
    )
    with pytest.raises(tinker.RequestFailedError, match="logprobs"):
        training.forward_backward([bad], "importance_sampling").result()
    with pytest.raises(tinker.RequestFailedError, match="--model no-such/model=PATH"):
        service_client.create_lora_training_client(base_model="no-such/model").result()

    headers = {"X-API-Key": server.api_key}
    with httpx.Client(base_url=server.base_url) as http:
        garbage = http.post("/api/v1/forward_backward", content=b"\xff\x00garbage", headers=headers)
        assert garbage.status_code == 400 and "ForwardBackwardRequest" in garbage.json()["detail"]
        missing = http.post("/api/v1/optim_step", json={"model_id": training.model_id}, headers=headers)
        assert missing.status_code == 400 and "adam_params" in missing.json()["detail"]
        wrong_key = http.post("/api/v1/create_session", json={}, headers={"X-API-Key": "tml-wrong"})
        assert wrong_key.status_code == 401 and "X-API-Key" in wrong_key.json()["detail"]
        gone = http.post("/api/v1/retrieve_future", json={"request_id": "sample-999999"}, headers=headers)
        assert gone.status_code == 404 and "sample-999999" in gone.json()["detail"]
        for path in ("tinker://../weights/x", f"tinker://{training.model_id}/weights/..", "/etc/passwd"):
            escape = http.post(
                "/api/v1/load_weights",
                json={"model_id": training.model_id, "seq_id": 99, "path": path, "optimizer": False},
                headers=headers,
            )
            assert escape.status_code == 400 and "checkpoint" in escape.json()["detail"], path
    # Still serving, and the run still trains.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert training.forward_backward([_datum(tokens)], "cross_entropy").result().metrics["loss:sum"] > 0
    assert torch.isfinite(torch.tensor(training.optim_step(types.AdamParams()).result().metrics["grad_norm:mean"]))
