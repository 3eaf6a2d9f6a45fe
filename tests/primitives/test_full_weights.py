"""Full-weight training (`full_weights=True`): every weight trains, the sampler gets them whole, the
reference is the untouched base, checkpoints round-trip, and a LoRA checkpoint is refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from agl_bridge.models.loading import load_causal_lm
from agl_bridge.primitives import AdamParams, TrainingClient
from agl_bridge.primitives.checkpoint import CheckpointMismatchError
from tests.datum_helpers import rl_batch

ADAM = AdamParams(learning_rate=1e-3)


def _weights(client: TrainingClient) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in client._run(client._trained_state).items()}


def test_every_weight_trains_and_the_sampler_and_files_get_them(
    make_client: Callable[..., TrainingClient], tiny_model_dir: Path, tmp_path: Path
) -> None:
    client = make_client(full_weights=True)
    base = load_causal_lm(tiny_model_dir)
    assert sum(p.numel() for p in client.trainable_parameters()) == sum(p.numel() for p in base.parameters())
    data = rl_batch(client, count=4, seed=2)
    before = client.forward(data).loss_fn_outputs
    client.forward_backward(data, "importance_sampling", {"kl_coef": 0.1})
    client.optim_step(ADAM)
    after = client.forward(data).loss_fn_outputs
    assert max(float((a["logprobs"] - b["logprobs"]).abs().max()) for a, b in zip(after, before, strict=True)) > 1e-3

    # The reference is the policy before training: a frozen copy of the base, not the trained weights.
    for reference, first in zip(client.reference_logprobs(data), before, strict=True):
        torch.testing.assert_close(reference, first["logprobs"], atol=1e-6, rtol=0)

    # The sampler gets every weight and scores like the trainer.
    sampling = client.save_weights_and_get_sampling_client()
    tokens = [*data[0].model_input, int(data[0].loss_fn_inputs["target_tokens"][-1])]
    torch.testing.assert_close(
        torch.tensor(sampling.compute_logprobs(tokens)[1:]), after[0]["logprobs"], atol=1e-5, rtol=0
    )

    # save_weights_for_sampler writes a model directory that transformers loads as the trained model.
    saved = load_causal_lm(client.save_weights_for_sampler(tmp_path / "model"))
    with torch.no_grad():
        logits = saved(input_ids=torch.tensor([data[0].model_input])).logits
    targets = torch.tensor(data[0].loss_fn_inputs["target_tokens"])
    saved_logprobs = torch.log_softmax(logits[0].float(), -1).gather(1, targets.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(saved_logprobs, after[0]["logprobs"], atol=1e-5, rtol=0)

    # Checkpoints round-trip the weights and the optimizer.
    client.save_state(tmp_path / "state")
    restored = make_client(full_weights=True)
    assert restored.load_state(tmp_path / "state") == 1
    assert all(torch.equal(a, b) for a, b in zip(_weights(restored).values(), _weights(client).values(), strict=True))
    for trainer in (client, restored):
        trainer.forward_backward(data, "importance_sampling")
        trainer.optim_step(ADAM)
    assert all(torch.equal(a, b) for a, b in zip(_weights(restored).values(), _weights(client).values(), strict=True))


def test_a_lora_checkpoint_is_refused_by_a_full_weight_client_and_bad_settings_are_named(
    make_client: Callable[..., TrainingClient], tmp_path: Path
) -> None:
    lora = make_client()
    lora.save_state(tmp_path / "lora")
    with pytest.raises(CheckpointMismatchError, match="lora_rank"):
        make_client(full_weights=True).load_state(tmp_path / "lora")
    settings: dict[str, Any] = {"full_weights": True, "train_unembedding": True}
    with pytest.raises(ValueError, match="full_weights trains the output layer already"):
        make_client(**settings)
