"""TrainingClient pieces the algorithms need: LoRA targets the sampler can merge (MoE), reference logprobs,
and the GSPO / rollout-corrected gradients through the real model against a plain-torch reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from datum_helpers import rl_batch
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import LoraLayer
from test_client import _assert_grads_close, _grads, _perturbed, _warm_up

from agl_bridge.models.loading import load_causal_lm
from agl_bridge.models.tiny import build_tiny_model
from agl_bridge.primitives import AdamParams, Datum


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("moe") / "m", family="qwen3_moe", hidden=64, layers=2, vocab=512)


def test_moe_default_targets_leave_out_experts_and_router_and_sync_into_the_sampler(make_client, moe_dir) -> None:
    client = make_client(base_model=moe_dir, lora_rank=4)
    adapted = client.identity.target_modules
    assert adapted and all(name.rsplit(".", 1)[-1] in ("q_proj", "k_proj", "v_proj", "o_proj") for name in adapted)
    data = [Datum.from_sequence(list(range(10, 30)), [0] * 5 + [1] * 15)]
    client.forward_backward(data, "cross_entropy")
    client.optim_step(AdamParams(learning_rate=1e-2))
    sampling = client.save_weights_and_get_sampling_client()  # peft's own all-linear would be refused here
    trainer = client.forward(data).loss_fn_outputs[0]["logprobs"]
    sampler = torch.tensor(sampling.compute_logprobs(list(range(10, 31)))[1:])
    assert float((trainer - sampler[: len(trainer)]).abs().max()) < 1e-4


def test_targets_the_sampler_cannot_merge_are_refused_by_name_before_training(make_client) -> None:
    # peft adapts embeddings, but the in-process sampler merges into linear layers only.
    with pytest.raises(
        ValueError, match=r"LoRA target 'model.embed_tokens' is of type Embedding.*cannot merge"
    ) as refused:
        make_client(target_modules=["q_proj", "embed_tokens"])
    assert "lora_target_modules" in str(refused.value)


def test_dense_default_targets_are_exactly_peft_all_linear(make_client, tiny_model_dir) -> None:
    client = make_client()
    peft_model = get_peft_model(load_causal_lm(tiny_model_dir), LoraConfig(r=8, target_modules="all-linear"))
    expected = sorted(
        name.removeprefix("base_model.model.")
        for name, module in peft_model.named_modules()
        if isinstance(module, LoraLayer)
    )
    assert list(client.identity.target_modules) == expected
    assert client.model.peft_config["default"].target_modules == peft_model.peft_config["default"].target_modules


def test_reference_logprobs_are_the_base_model_s(make_client) -> None:
    client = make_client()
    data = rl_batch(client, count=3)
    before = [out["logprobs"] for out in client.forward(data).loss_fn_outputs]
    for a, b in zip(client.reference_logprobs(data), before, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    _warm_up(client, lr=3e-2)
    after = [out["logprobs"] for out in client.forward(data).loss_fn_outputs]
    assert max(float((a - b).abs().max()) for a, b in zip(after, before, strict=True)) > 1e-3
    for a, b in zip(client.reference_logprobs(data), before, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("loss", "config"),
    [
        ("gspo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
        ("gspo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1, "tis_cap": 1.05}),
        ("importance_sampling", {"tis_cap": 1.05, "correction_level": "sequence", "geo_high": 1.2}),
    ],
    ids=["gspo", "gspo-decoupled-seq-tis", "is-seq-tis-geo"],
)
def test_gradients_through_the_model_match_a_plain_torch_reference(make_client, loss: str, config: dict) -> None:
    client = make_client()
    _warm_up(client)
    data = _perturbed(rl_batch(client, count=4), seed=3)
    out = client.forward_backward(data, loss, config)
    ours = _grads(client)
    client.zero_grad()

    # Reference: one unpadded forward per datum; the sequence written out in plain torch.
    total = torch.zeros(())
    for datum in data:
        inputs = datum.loss_fn_inputs
        logits = client.model(input_ids=torch.tensor([datum.model_input])).logits[0]
        lp = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(inputs["target_tokens"]).unsqueeze(1))
        lp = lp.squeeze(1)
        w, s, a = (torch.tensor(inputs[k]) for k in ("weights", "logprobs", "advantages"))
        on = w > 0
        if loss == "gspo":
            corrected = "tis_cap" in config
            proximal = lp.detach() if corrected else s  # decoupled: the policy itself; bypass: the sampler
            ratio = torch.exp((lp[on] - proximal[on]).mean())
            coef = min(float(torch.exp((lp.detach()[on] - s[on]).sum())), config["tis_cap"]) if corrected else 1.0
            advantage = float(a[on][0])  # one per sequence here
            term = torch.minimum(ratio * advantage, ratio.clamp(0.9, 1.1) * advantage)
            total = total - coef * int(on.sum()) * term
        else:
            sequence_ratio = float(torch.exp((lp.detach()[on] - s[on]).sum()))
            geometric = float(torch.exp((lp.detach()[on] - s[on]).mean()))
            coef = 0.0 if geometric > 1.2 else min(sequence_ratio, 1.05)
            total = total - coef * (lp[on] * a[on]).sum()
    total.backward()
    reference = _grads(client)
    client.zero_grad()
    assert out.metrics["loss"] == pytest.approx(float(total.detach()), rel=1e-4, abs=1e-6)
    assert any(float(g.abs().max()) > 0 for g in reference)
    _assert_grads_close(ours, reference)
