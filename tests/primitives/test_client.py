"""TrainingClient: gradients, accumulation, optimizer, KL, custom losses, async calls, learning."""

from __future__ import annotations

import math

import pytest
import torch
from datum_helpers import random_sequences, rl_batch

from agl_bridge.primitives import AdamParams, Datum, TrainFuture


def _grads(client) -> list[torch.Tensor]:
    return [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in client.trainable_parameters()]


def _assert_grads_close(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    """Equal up to float32 reduction-order noise: 1e-5 of each tensor's largest entry."""
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5 * max(float(y.abs().max()), 1e-3))


def _perturbed(data: list[Datum], seed: int = 1) -> list[Datum]:
    """The same datums with sampler logprobs moved by up to ±0.3 so ratios are not 1."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for datum in data:
        inputs = dict(datum.loss_fn_inputs)
        noise = (torch.rand(len(datum.model_input), generator=generator) - 0.5) * 0.6
        inputs["logprobs"] = [min(lp + float(n), 0.0) for lp, n in zip(inputs["logprobs"], noise, strict=True)]
        out.append(Datum(datum.model_input, inputs))
    return out


def _warm_up(client, lr: float = 1e-2) -> None:
    """One cross-entropy step so LoRA B is nonzero and every adapter parameter gets gradients."""
    data = [Datum.from_sequence(s, [0] + [1] * (len(s) - 1)) for s in random_sequences(2, seed=9)]
    client.forward_backward(data, "cross_entropy")
    client.optim_step(AdamParams(learning_rate=lr))


def test_importance_sampling_gradient_equals_plain_autograd(make_client) -> None:
    client = make_client()
    _warm_up(client)
    data = _perturbed(rl_batch(client, count=3))
    out = client.forward_backward(data, "importance_sampling")
    ours = _grads(client)
    client.zero_grad()

    # Reference: one unpadded forward per datum and -sum(w * exp(lp - s) * A) in plain torch.
    total = torch.zeros(())
    for datum in data:
        inputs = datum.loss_fn_inputs
        logits = client.model(input_ids=torch.tensor([datum.model_input])).logits[0]
        lp = (
            torch.log_softmax(logits.float(), -1)
            .gather(1, torch.tensor(inputs["target_tokens"]).unsqueeze(1))
            .squeeze(1)
        )
        w, s, a = (torch.tensor(inputs[k]) for k in ("weights", "logprobs", "advantages"))
        total = total - (w * torch.exp(lp - s) * a).sum()
    total.backward()
    reference = _grads(client)
    client.zero_grad()

    assert out.metrics["loss"] == pytest.approx(float(total.detach()), rel=1e-5)
    assert any(float(g.abs().max()) > 0 for g in reference)
    _assert_grads_close(ours, reference)


def test_gradients_accumulate_across_calls_and_micro_batches(make_client, tmp_path) -> None:
    client = make_client()
    _warm_up(client)
    data = _perturbed(rl_batch(client, count=4))
    client.forward_backward(data, "ppo")
    together = _grads(client)
    client.zero_grad()
    client.forward_backward(data[:2], "ppo")
    client.forward_backward(data[2:], "ppo")
    _assert_grads_close(_grads(client), together)
    client.zero_grad()

    small = make_client(max_batch_tokens=20)  # every datum in its own micro-batch
    small.load_state(client.save_state(tmp_path / "state"))
    small.forward_backward(data, "ppo")
    _assert_grads_close(_grads(small), together)


def test_forward_has_no_gradients_and_returns_aligned_logprobs(make_client) -> None:
    client = make_client()
    data = rl_batch(client, count=2)
    out = client.forward(data, "importance_sampling")
    assert all(p.grad is None for p in client.trainable_parameters())
    assert [len(o["logprobs"]) for o in out.loss_fn_outputs] == [d.num_tokens for d in data]
    assert not out.loss_fn_outputs[0]["logprobs"].requires_grad
    assert out.metrics["num_datums"] == 2
    assert out.metrics["tokens"] == sum(sum(1 for w in d.loss_fn_inputs["weights"] if w > 0) for d in data)
    assert 0 < out.metrics["entropy_mean"] < math.log(client.vocab_size)


def test_optim_step_sets_lr_per_call_clips_and_zeroes_gradients(make_client) -> None:
    client = make_client()
    data = _perturbed(rl_batch(client, count=2))
    before = [p.detach().clone() for p in client.trainable_parameters()]
    client.forward_backward(data, "importance_sampling")
    result = client.optim_step(AdamParams(learning_rate=0.0))
    assert result.metrics["lr"] == 0.0 and result.metrics["grad_norm"] > 0 and client.step == 1
    assert all(torch.equal(a, b) for a, b in zip(before, client.trainable_parameters(), strict=True))
    assert all(p.grad is None for p in client.trainable_parameters())

    client.forward_backward(data, "importance_sampling")
    result = client.optim_step(AdamParams(learning_rate=1e-3, grad_clip_norm=1e-3))
    assert result.metrics["lr"] == 1e-3 and client.step == 2
    assert client._optimizer.param_groups[0]["lr"] == 1e-3
    assert any(not torch.equal(a, b) for a, b in zip(before, client.trainable_parameters(), strict=True))

    with pytest.raises(ValueError, match="AdamParams.beta2"):
        client.optim_step(AdamParams(beta2=1.0))


def test_non_finite_gradients_are_refused_and_discarded(make_client) -> None:
    client = make_client()
    before = [p.detach().clone() for p in client.trainable_parameters()]
    data = [Datum.from_sequence([3, 4, 5], [0, 1, 1])]
    client.forward_backward_custom(data, lambda d, lps: (lps[0].sum() * math.inf, {}))
    with pytest.raises(FloatingPointError, match="update was skipped"):
        client.optim_step(AdamParams(learning_rate=1e-2))
    assert client.step == 0
    assert all(p.grad is None for p in client.trainable_parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, client.trainable_parameters(), strict=True))


def test_kl_is_zero_before_training_and_positive_after(make_client) -> None:
    client = make_client()
    data = rl_batch(client, count=2)
    config = {"kl_coef": 0.5}
    first = client.forward_backward(data, "importance_sampling", config)
    assert first.metrics["kl_mean"] == 0.0
    client.optim_step(AdamParams(learning_rate=3e-2))

    with_kl = client.forward(data, "importance_sampling", config)
    without = client.forward(data, "importance_sampling")
    assert with_kl.metrics["kl_mean"] > 1e-6
    assert "kl_mean" not in without.metrics
    # The loss grows by kl_coef * sum(w * k3), recomputed here from the returned logprobs.
    k3_sum = 0.0
    for datum, out in zip(data, with_kl.loss_fn_outputs, strict=True):
        delta = out["ref_logprobs"].double() - out["logprobs"].double()
        k3_sum += float((torch.tensor(datum.loss_fn_inputs["weights"]) * (delta.exp() - delta - 1)).sum())
    assert with_kl.metrics["loss"] - without.metrics["loss"] == pytest.approx(0.5 * k3_sum, rel=1e-4)


def test_custom_loss_matches_the_builtin_one(make_client) -> None:
    client = make_client()
    _warm_up(client)
    data = rl_batch(client, count=3)
    builtin = client.forward_backward(data, "cross_entropy")
    expected = _grads(client)
    client.zero_grad()

    def my_cross_entropy(batch: list[Datum], logprobs: list[torch.Tensor]):
        loss = sum(
            -(torch.tensor(d.loss_fn_inputs["weights"]) * lp).sum() for d, lp in zip(batch, logprobs, strict=True)
        )
        return loss, {"custom_metric": 3.0}

    custom = client.forward_backward_custom(data, my_cross_entropy)
    _assert_grads_close(_grads(client), expected)
    assert custom.metrics["loss"] == pytest.approx(builtin.metrics["loss"], rel=1e-6)
    assert custom.metrics["custom_metric"] == 3.0
    with pytest.raises(TypeError, match="scalar tensor"):
        client.forward_backward_custom(data, lambda d, lps: (1.0, {}))


def test_unknown_loss_and_stray_config_are_refused(make_client) -> None:
    client = make_client()
    data = rl_batch(client, count=1)
    with pytest.raises(ValueError, match="known losses: cross_entropy, importance_sampling, ppo, cispo"):
        client.forward_backward(data, "reinforce")
    with pytest.raises(ValueError, match="without a loss_fn"):
        client.forward(data, None, {"kl_coef": 0.1})


async def test_async_calls_run_in_submission_order(make_client) -> None:
    client = make_client()
    data = _perturbed(rl_batch(client, count=2))
    fb = client.forward_backward_async(data, "importance_sampling")
    step = client.optim_step_async(AdamParams(learning_rate=1e-2))
    after = client.forward_async(data, "importance_sampling")
    assert isinstance(fb, TrainFuture)
    first, stepped, later = await fb, await step, await after
    assert stepped.metrics["step"] == 1.0 and client.step == 1
    assert first.metrics["loss"] != later.metrics["loss"]  # the forward saw the updated weights
    sync = await client.save_weights_and_get_sampling_client_async("async")
    assert sync.name == "async" and sync.is_current


def test_cross_entropy_steps_raise_the_logprob_of_a_target(make_client) -> None:
    client = make_client()
    tokenizer = client.get_tokenizer()
    prompt = tokenizer("Q: what is six times seven? A:")["input_ids"]
    answer = tokenizer(" forty-two, of course")["input_ids"]
    datum = Datum.from_sequence(prompt + answer, [0] * len(prompt) + [1] * len(answer))

    def answer_logprob() -> float:
        return float(client.forward([datum]).loss_fn_outputs[0]["logprobs"][len(prompt) - 1 :].sum())

    before = answer_logprob()
    losses = []
    for _ in range(4):
        losses.append(client.forward_backward([datum], "cross_entropy").metrics["loss"])
        client.optim_step(AdamParams(learning_rate=1e-2))
    after = answer_logprob()
    assert after > before + 1.0, (before, after)
    assert losses[-1] < losses[0]


def test_mixed_batches_fill_missing_optional_fields_per_datum(make_client) -> None:
    client = make_client()
    _warm_up(client)
    data = _perturbed(rl_batch(client, count=2))
    # Datum 1 brings old_logprobs, datum 0 does not (its old policy is the sampler).
    inputs = dict(data[1].loss_fn_inputs)
    inputs["old_logprobs"] = [lp - 0.1 for lp in inputs["logprobs"]]
    mixed = [data[0], Datum(data[1].model_input, inputs)]
    together = client.forward(mixed, "ppo").metrics["loss"]
    apart = sum(client.forward([d], "ppo").metrics["loss"] for d in mixed)
    assert together == pytest.approx(apart, rel=1e-5)

    # Gap statistics use only the datums that carry sampler logprobs.
    plain = Datum(
        data[1].model_input,
        {"target_tokens": data[1].loss_fn_inputs["target_tokens"], "weights": data[1].loss_fn_inputs["weights"]},
    )
    both = client.forward([data[0], plain], "cross_entropy").metrics
    alone = client.forward([data[0]], "cross_entropy").metrics
    assert both["logprob_diff_abs_mean"] == pytest.approx(alone["logprob_diff_abs_mean"], rel=1e-6)
    assert "ratio_mean" not in client.forward([plain], "cross_entropy").metrics


def test_seed_fixes_the_lora_init_without_touching_the_global_rng(make_client) -> None:
    torch.manual_seed(7)
    expected_draw = torch.rand(2)
    torch.manual_seed(7)
    a, b, c = make_client(seed=1), make_client(seed=1), make_client(seed=2)
    assert torch.equal(torch.rand(2), expected_draw)
    pa, pb, pc = (client.trainable_parameters() for client in (a, b, c))
    assert all(torch.equal(x, y) for x, y in zip(pa, pb, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(pa, pc, strict=True))
