"""Trainer ⇄ sampler agreement: on-policy ratio 1, live weight sync (LoRA and lm_head), its latency."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest
import torch
from datum_helpers import random_sequences, rl_batch

from agl_bridge.models.loading import load_causal_lm
from agl_bridge.primitives import AdamParams, Datum, SamplingClient
from agl_bridge.sampler.base import SamplingParams
from agl_bridge.sampler.hf import HFSampler
from agl_bridge.sampler.hf_process import HFProcessSampler


def _sampled_batch(
    sampling: SamplingClient | HFSampler | HFProcessSampler, prompts: list[list[int]], advantages: list[float]
) -> list[Datum]:
    """Sample one completion per prompt at temperature 1 and turn each into an RL datum."""
    data = []
    for i, (prompt, advantage) in enumerate(zip(prompts, advantages, strict=True)):
        sequence = sampling.sample(prompt, SamplingParams(max_tokens=12, temperature=1.0, stop=[], seed=i)).sequences[0]
        tokens = prompt + sequence.tokens
        mask = [0] * len(prompt) + [1] * len(sequence.tokens)
        data.append(Datum.from_sequence(tokens, mask, [None] * len(prompt) + sequence.logprobs, advantage))
    return data


def test_first_on_policy_step_has_ratio_one_and_no_truncation(
    make_client, tiny_model_dir: Path, tiny_tokenizer
) -> None:
    with HFSampler(load_causal_lm(tiny_model_dir), tiny_tokenizer, seed=0) as sampler:
        client = make_client(sampler=sampler)
        data = _sampled_batch(sampler, random_sequences(4, seed=3), [1.0, -1.0, 0.5, -0.5])
        metrics = client.forward_backward(data, "importance_sampling", {"tis_cap": 2.0}).metrics
    assert metrics["tokens"] == 48
    assert metrics["logprob_diff_abs_max"] < 1e-4
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["tis_capped_frac"] == 0.0
    assert metrics["prob_pearson"] > 0.9999


def test_sync_makes_the_sampler_score_like_the_trainer(make_client) -> None:
    client = make_client()
    first = client.save_weights_and_get_sampling_client("v1")  # creates the sampler over the base weights
    data = _sampled_batch(first, random_sequences(3, seed=4), [1.0, -1.0, 1.0])
    base_scores = [first.compute_logprobs(d.model_input + [d.loss_fn_inputs["target_tokens"][-1]]) for d in data]
    for _ in range(2):
        client.forward_backward(data, "importance_sampling")
        client.optim_step(AdamParams(learning_rate=2e-2))

    synced = client.save_weights_and_get_sampling_client("v2")
    assert synced.weights_version == first.weights_version + 1 == synced.policy_version
    assert not first.is_current and synced.is_current
    trainer = client.forward(data).loss_fn_outputs
    for datum, ours, base in zip(data, trainer, base_scores, strict=True):
        sampler_lp = synced.compute_logprobs(datum.model_input + [datum.loss_fn_inputs["target_tokens"][-1]])[1:]
        torch.testing.assert_close(torch.tensor(sampler_lp), ours["logprobs"], rtol=0, atol=1e-4)
        assert max(abs(a - b) for a, b in zip(sampler_lp, base[1:], strict=True)) > 1e-2  # the weights did change
    result = synced.sample([5, 6, 7], SamplingParams(max_tokens=4, stop=[]))
    assert result.sequences[0].token_policy_versions == [synced.weights_version] * 4


def test_trained_unembedding_syncs_without_touching_the_input_embeddings(
    make_client, tiny_model_dir: Path, tiny_tokenizer
) -> None:
    client = make_client(train_unembedding=True)
    data = rl_batch(client, count=2)
    client.forward_backward(data, "importance_sampling")
    client.optim_step(AdamParams(learning_rate=2e-2))
    synced = client.save_weights_and_get_sampling_client()
    trainer = client.forward(data).loss_fn_outputs
    for datum, ours in zip(data, trainer, strict=True):
        sampler_lp = synced.compute_logprobs(datum.model_input + [datum.loss_fn_inputs["target_tokens"][-1]])[1:]
        torch.testing.assert_close(torch.tensor(sampler_lp), ours["logprobs"], rtol=0, atol=1e-4)
    sampler_model = client.sampler.model
    base = load_causal_lm(tiny_model_dir)
    assert torch.equal(sampler_model.get_input_embeddings().weight, base.get_input_embeddings().weight)
    assert not torch.equal(sampler_model.get_output_embeddings().weight, base.get_output_embeddings().weight)

    with HFSampler(load_causal_lm(tiny_model_dir), tiny_tokenizer) as tied, pytest.raises(ValueError, match="untied"):
        make_client(train_unembedding=True, sampler=tied)
    # Untied by hand, as the error suggests, it is accepted.
    untied_model = load_causal_lm(tiny_model_dir)
    untied_model.lm_head.weight = torch.nn.Parameter(untied_model.lm_head.weight.detach().clone())
    untied_model.config.tie_word_embeddings = False
    with HFSampler(untied_model, tiny_tokenizer) as untied:
        other = make_client(train_unembedding=True, sampler=untied)
        assert other.save_weights_and_get_sampling_client().weights_version == 1


def test_sync_is_fast_and_drops_no_request_in_flight(make_client) -> None:
    client = make_client(lora_rank=16)
    sampling = client.save_weights_and_get_sampling_client()
    params = SamplingParams(max_tokens=400, temperature=1.0, stop=[])
    in_flight = [sampling.sampler.submit([5, 6, 7, 8], params) for _ in range(3)]
    timings = []
    for _ in range(5):
        start = time.perf_counter()
        client.save_weights_and_get_sampling_client()
        timings.append(time.perf_counter() - start)
    results = [future.result(timeout=120) for future in in_flight]
    assert statistics.median(timings) <= 0.1, timings
    assert all(len(r.sequences[0].tokens) == 400 for r in results)
    # Tokens kept coming across the swaps: each sequence saw more than one policy version.
    assert all(len(set(r.sequences[0].token_policy_versions)) > 1 for r in results)


@pytest.mark.slow
def test_sync_to_a_sampler_in_its_own_process_scores_like_the_trainer(make_client, tiny_model_dir: Path) -> None:
    with HFProcessSampler(tiny_model_dir, seed=0, torch_threads=1) as sampler:
        with pytest.raises(ValueError, match="untied"):  # it reports its model's tied embeddings
            make_client(train_unembedding=True, sampler=sampler)
        client = make_client(sampler=sampler)
        data = _sampled_batch(sampler, random_sequences(3, seed=5), [1.0, -1.0, 1.0])
        client.forward_backward(data, "importance_sampling")
        client.optim_step(AdamParams(learning_rate=2e-2))
        synced = client.save_weights_and_get_sampling_client()
        assert synced.weights_version == 1 == sampler.policy_version
        trainer = client.forward(data).loss_fn_outputs
        for datum, ours in zip(data, trainer, strict=True):
            sampler_lp = sampler.compute_logprobs(datum.model_input + [datum.loss_fn_inputs["target_tokens"][-1]])[1:]
            torch.testing.assert_close(torch.tensor(sampler_lp), ours["logprobs"], rtol=0, atol=1e-4)
        versions = sampler.sample([5, 6, 7], SamplingParams(max_tokens=4, stop=[])).sequences[0].token_policy_versions
        assert versions == [1] * 4
