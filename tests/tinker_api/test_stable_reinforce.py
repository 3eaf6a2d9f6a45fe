"""`stable_reinforce` through the unmodified SDK: samples recorded with `record_stability_info=True`, datums
naming them with provenance spans (as tinker-cookbook's rl_loop builds them), the loss computed against
the server's record — the same as our loss in-process — and datums that do not match the record refused.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import pytest
import tinker
from tinker import types

from agl_bridge.primitives import Datum, TrainingClient
from agl_bridge.proxy.server import bind_socket
from agl_bridge.tinker_api.server import TinkerServer

os.environ.setdefault("TINKER_TELEMETRY", "0")

RECIPE_NAME = "Qwen/Qwen3-8B"
CONFIG = {"kl_coeff": 0.1, "tis_cap": 1.5}


@pytest.fixture(scope="module")
def training(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tinker.TrainingClient]:
    root = tmp_path_factory.mktemp("tinker-root")
    with (
        TinkerServer(bind_socket("127.0.0.1", 0), root, models={RECIPE_NAME: "tiny"}) as server,
        tinker.ServiceClient(base_url=server.base_url, api_key=server.api_key) as service,
    ):
        yield service.create_lora_training_client(base_model=RECIPE_NAME, rank=4, seed=2).result()


def _samples(training: tinker.TrainingClient, *, record: bool) -> tuple[list[int], list[types.SampledSequence]]:
    prompt = training.get_tokenizer().encode("Let's play a game. Say you are 42.")
    sampler = training.save_weights_and_get_sampling_client(record_stability_info=record).result()
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=5)
    return prompt, sampler.sample(types.ModelInput.from_ints(prompt), 4, params).result().sequences


def _datum(
    prompt: list[int],
    sequence: types.SampledSequence,
    advantage: float,
    *,
    logprobs: list[float] | None = None,
    sampled_tokens: list[int] | None = None,
) -> types.Datum:
    """rl_loop's datum: the prompt's targets carry no advantage, every sampled token carries `advantage`
    (`logprobs` / `sampled_tokens`: what a client claims instead of the sample)."""
    tokens = prompt + list(sampled_tokens or sequence.tokens)
    sampled = len(sequence.tokens)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": [0.0] * (len(prompt) - 1) + list(logprobs or sequence.logprobs),
            "advantages": [0.0] * (len(prompt) - 1) + [advantage] * sampled,
        },
    )
    sequence_id = sequence.sequence_id
    assert sequence_id is not None
    return datum.with_provenance(
        model_input=[
            types.PromptProvenanceSpan(sequence_id=sequence_id, length=len(prompt)),
            types.SampledProvenanceSpan(sequence_id=sequence_id, length=sampled - 1),
        ],
        loss_fn_inputs=[
            types.PromptProvenanceSpan(sequence_id=sequence_id, offset=1, length=len(prompt) - 1),
            types.SampledProvenanceSpan(sequence_id=sequence_id, length=sampled),
        ],
    )


@pytest.mark.slow
def test_the_loss_uses_the_record_and_matches_ours_in_process(training: tinker.TrainingClient) -> None:
    prompt, sequences = _samples(training, record=True)
    advantages = [1.0, -1.0, 0.5, -0.5]
    honest = [_datum(prompt, s, a) for s, a in zip(sequences, advantages, strict=True)]
    # The client's logprobs are not what the loss uses: the server's record of the samples is.
    claimed = [
        _datum(prompt, s, a, logprobs=[-0.01] * len(s.tokens)) for s, a in zip(sequences, advantages, strict=True)
    ]
    wire = training.forward(honest, "stable_reinforce", CONFIG).result()
    tampered = training.forward(claimed, "stable_reinforce", CONFIG).result()
    assert tampered.metrics["loss:sum"] == wire.metrics["loss:sum"]

    local = TrainingClient("tiny", lora_rank=4, seed=2, train_unembedding=True)
    data = []
    for sequence, advantage in zip(sequences, advantages, strict=True):
        tokens = prompt + list(sequence.tokens)
        mask = [0.0] * len(prompt) + [1.0] * len(sequence.tokens)
        logprobs = [0.0] * len(prompt) + list(sequence.logprobs)
        data.append(Datum.from_sequence(tokens, mask, logprobs, advantage))
    ours = local.forward(data, "stable_reinforce", CONFIG)
    local.close()
    assert wire.metrics["loss:sum"] == pytest.approx(ours.metrics["loss"], rel=1e-6)
    assert wire.metrics["sampler_kl:mean"] < 1e-6, "the trainer scores the samples as the sampler did"

    step = training.forward_backward(honest, "stable_reinforce", CONFIG).result()
    assert step.metrics["loss:sum"] == pytest.approx(wire.metrics["loss:sum"], rel=1e-6)
    assert training.optim_step(types.AdamParams(learning_rate=1e-3)).result().metrics


@pytest.mark.slow
def test_datums_that_do_not_match_the_record_are_refused(training: tinker.TrainingClient) -> None:
    prompt, sequences = _samples(training, record=True)
    sequence = sequences[0]
    cases: list[tuple[types.Datum, str]] = []

    altered = [*sequence.tokens[:-1], (sequence.tokens[-1] + 1) % 100]
    cases.append((_datum(prompt, sequence, 1.0, sampled_tokens=altered), "differ from the tokens"))
    prompt_advantage = _datum(prompt, sequence, 1.0)
    prompt_advantage.loss_fn_inputs["advantages"] = types.TensorData.from_numpy(
        prompt_advantage.loss_fn_inputs["advantages"].to_numpy() + 1.0
    )
    cases.append((prompt_advantage, "advantage on prompt targets"))
    _, unrecorded = _samples(training, record=False)
    cases.append((_datum(prompt, unrecorded[0], 1.0), "was not recorded"))
    no_spans = dataclasses.replace(_datum(prompt, sequence, 1.0), loss_fn_input_spans=None, model_input_spans=None)
    cases.append((no_spans, "provenance spans"))

    for datum, message in cases:
        with pytest.raises(tinker.BadRequestError) as refused:
            training.forward_backward([datum], "stable_reinforce").result()
        assert refused.value.status_code == 400 and "data[0]" in str(refused.value), message
        assert message in str(refused.value)
    # The run goes on: the refused calls took their turns.
    assert training.forward_backward([_datum(prompt, sequence, 1.0)], "stable_reinforce").result().metrics
