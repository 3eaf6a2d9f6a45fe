"""The built-in losses against values worked out by hand on tiny tensors (no model involved).

Expected numbers are written out: e.g. exp(0.1) = 1.1051709180756477, exp(-0.5) = 0.6065306597126334,
log(1.5) = 0.4054651081081644, log(1.25) = 0.22314355131420976.
"""

from __future__ import annotations

import math

import pytest
import torch

from agl_bridge.primitives.losses import (
    LOSSES,
    compute_loss,
    get_loss,
    kl_k3,
    resolve_config,
)


def _run(name: str, lp: list[float], config: dict | None = None, ref: list[float] | None = None, **inputs: list[float]):
    """Loss value, d loss / d lp, and per-token metric means over weight > 0 tokens."""
    spec = get_loss(name)
    lp_t = torch.tensor(lp, dtype=torch.float64, requires_grad=True)
    tensors = {k: torch.tensor(v, dtype=torch.float64) for k, v in inputs.items()}
    tensors.setdefault("weights", torch.ones(len(lp), dtype=torch.float64))
    ref_t = torch.tensor(ref, dtype=torch.float64) if ref is not None else None
    out = compute_loss(spec, lp_t, tensors, resolve_config(spec, config), ref_t)
    out.loss.backward()
    active = tensors["weights"] > 0
    means = {k: float(v[active].mean()) for k, v in out.token_metrics.items()}
    return float(out.loss.detach()), lp_t.grad.tolist(), means


# Shared RL case: ratios exp(lp - s) = [e^0.1, 1, e^-0.5] on the active tokens; the last is masked.
LP = [-1.0, -0.5, -2.0, -0.3]
S = [-1.1, -0.5, -1.5, -0.3]
ADV = [1.0, -2.0, 0.5, 3.0]
W = [1.0, 1.0, 1.0, 0.0]


def test_cross_entropy_is_minus_weighted_sum() -> None:
    loss, grad, _ = _run("cross_entropy", [-1.0, -0.5, -2.0, -0.3], weights=[1.0, 0.5, 0.0, 2.0])
    # -(1*-1 + 0.5*-0.5 + 0 + 2*-0.3) = 1.85
    assert loss == pytest.approx(1.85)
    assert grad == pytest.approx([-1.0, -0.5, 0.0, -2.0])


def test_importance_sampling_value_and_gradient() -> None:
    loss, grad, metrics = _run("importance_sampling", LP, logprobs=S, advantages=ADV, weights=W)
    # -(1.1051709180756477*1 + 1*(-2) + 0.6065306597126334*0.5)
    assert loss == pytest.approx(0.5915637520680356, abs=1e-12)
    # d/dlp of -w*rho*A is -w*rho*A
    assert grad == pytest.approx([-1.1051709180756477, 2.0, -0.3032653298563167, 0.0], abs=1e-12)
    assert "tis_capped_frac" not in metrics


def test_truncated_importance_sampling_caps_the_ratio_and_keeps_gradients_below_it() -> None:
    loss, grad, metrics = _run("importance_sampling", LP, {"tis_cap": 1.05}, logprobs=S, advantages=ADV, weights=W)
    # -(min(e^0.1, 1.05)*(-1)*1 + 1*(-0.5)*(-2) + e^-0.5*(-2)*0.5) = -(-1.05 + 1 - 0.6065306597126334)
    assert loss == pytest.approx(0.6565306597126334, abs=1e-12)
    # Token 0 (ratio 1.105 > 1.05) is truncated to 1.05; tokens 1-2 match plain IS exactly.
    assert grad == pytest.approx([-1.05, 2.0, -0.3032653298563167, 0.0], abs=1e-12)
    assert metrics["tis_capped_frac"] == pytest.approx(1 / 3)


def test_truncation_is_inactive_when_every_ratio_is_under_the_cap() -> None:
    _, plain, _ = _run("importance_sampling", LP, logprobs=S, advantages=ADV, weights=W)
    _, capped, metrics = _run("importance_sampling", LP, {"tis_cap": 2.0}, logprobs=S, advantages=ADV, weights=W)
    assert capped == pytest.approx(plain, abs=1e-12)
    assert metrics["tis_capped_frac"] == 0.0


# PPO/CISPO case: s = -1 everywhere and ratios [1.5, 1.5, 0.5, 0.5, 1.25, 1.0].
PPO_S = [-1.0] * 6
PPO_LP = [-0.5945348918918356, -0.5945348918918356, -1.6931471805599454, -1.6931471805599454, -0.7768564486857903, -1.0]
PPO_ADV = [1.0, -1.0, -1.0, 1.0, 2.0, 1.0]


def test_ppo_clips_symmetric() -> None:
    loss, grad, metrics = _run("ppo", PPO_LP, logprobs=PPO_S, advantages=PPO_ADV)
    # min terms: 1.2 (clipped high), -1.5, -0.8 (clipped low), 0.5, 2.4 (clipped high), 1.0 -> sum 2.8
    assert loss == pytest.approx(-2.8, abs=1e-9)
    assert grad == pytest.approx([0.0, 1.5, 0.0, -0.5, 0.0, -1.0], abs=1e-9)
    assert metrics["clip_low_frac"] == pytest.approx(1 / 6)
    assert metrics["clip_high_frac"] == pytest.approx(2 / 6)


def test_ppo_clip_higher_lets_moderate_positive_ratios_through() -> None:
    config = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}
    loss, grad, metrics = _run("ppo", PPO_LP, config, logprobs=PPO_S, advantages=PPO_ADV)
    # 1.28 - 1.5 - 0.8 + 0.5 + 2.5 + 1.0 = 2.98: the 1.25 ratio is no longer clipped
    assert loss == pytest.approx(-2.98, abs=1e-9)
    assert grad == pytest.approx([0.0, 1.5, 0.0, -0.5, -2.5, -1.0], abs=1e-9)
    assert metrics["clip_high_frac"] == pytest.approx(1 / 6)
    assert metrics["clip_low_frac"] == pytest.approx(1 / 6)


def test_cispo_clips_the_weight_but_keeps_every_gradient() -> None:
    loss, grad, metrics = _run("cispo", PPO_LP, logprobs=PPO_S, advantages=PPO_ADV)
    # -sum(clip(rho)*A*lp) with clip(rho) = [1.2, 1.2, 0.8, 0.8, 1.2, 1.0]
    assert loss == pytest.approx(2.8644554768458965, abs=1e-9)
    assert grad == pytest.approx([-1.2, 1.2, 0.8, -0.8, -2.4, -1.0], abs=1e-9)
    assert metrics["clip_low_frac"] == pytest.approx(2 / 6)
    assert metrics["clip_high_frac"] == pytest.approx(3 / 6)


def test_ppo_with_old_logprobs_uses_them_and_tis_corrects_the_sampler_gap() -> None:
    # ratio vs old = 1, A = 1; the sampler was exp(log 3) = 3x less likely than the old policy.
    old = [-1.0]
    sampler = [-1.0 - math.log(3.0)]
    loss, _, _ = _run("ppo", [-1.0], logprobs=sampler, old_logprobs=old, advantages=[1.0])
    assert loss == pytest.approx(-1.0)
    loss, _, metrics = _run("ppo", [-1.0], {"tis_cap": 2.0}, logprobs=sampler, old_logprobs=old, advantages=[1.0])
    assert loss == pytest.approx(-2.0)  # weight min(3, 2) = 2
    assert metrics["tis_capped_frac"] == 1.0


def test_dro_value_and_gradient_pull_towards_the_sampler() -> None:
    loss, grad, metrics = _run("dro", LP, {"beta": 0.5}, logprobs=S, advantages=ADV, weights=W)
    # gaps lp - s on the active tokens: 0.1, 0, -0.5; objective lp*A - beta/2*gap^2 per token:
    # -1 - 0.0025, 1, -1 - 0.0625 -> sum -1.065, loss +1.065
    assert loss == pytest.approx(1.065, abs=1e-12)
    # d/dlp of -(lp*A - beta/2*gap^2) = -A + beta*gap
    assert grad == pytest.approx([-1.0 + 0.05, 2.0, -0.5 - 0.25, 0.0], abs=1e-12)
    assert metrics["dro_penalty"] == pytest.approx((0.005 + 0 + 0.125) / 3, abs=1e-12)
    default, _, _ = _run("dro", LP, logprobs=S, advantages=ADV, weights=W)
    assert default == pytest.approx(-(-1.0 + 1.0 - 1.0) + 0.05 / 2 * (0.01 + 0.25), abs=1e-12)


def test_stable_reinforce_truncates_the_weight_and_pulls_towards_the_sampler() -> None:
    # ratios e^0.1, 1, e^-0.5 on the active tokens; a cap of 1.05 truncates the first.
    loss, grad, metrics = _run(
        "stable_reinforce", LP, {"tis_cap": 1.05, "kl_coeff": 0.5}, logprobs=S, advantages=ADV, weights=W
    )
    weights = [1.05, 1.0, 0.6065306597126334]
    kl = [1.1051709180756477 - 1 - 0.1, 0.0, 0.6065306597126334 - 1 + 0.5]
    expected = -sum(c * a * lp for c, a, lp in zip(weights, ADV, LP, strict=False)) + 0.5 * sum(kl)
    assert loss == pytest.approx(expected, abs=1e-12)
    # d/dlp = -min(rho, C)*A + kappa*(rho - 1)
    assert grad == pytest.approx(
        [-1.05 + 0.5 * 0.1051709180756477, 2.0, -0.5 * 0.6065306597126334 + 0.5 * (0.6065306597126334 - 1), 0.0],
        abs=1e-12,
    )
    assert metrics["tis_capped_frac"] == pytest.approx(1 / 3)
    assert metrics["sampler_kl"] == pytest.approx(sum(kl) / 3, abs=1e-12)
    # Defaults: cap 2 (nothing truncated here), no pull: the gradient is -rho*A, importance sampling's.
    _, default_grad, _ = _run("stable_reinforce", LP, logprobs=S, advantages=ADV, weights=W)
    _, is_grad, _ = _run("importance_sampling", LP, logprobs=S, advantages=ADV, weights=W)
    assert default_grad == pytest.approx(is_grad, abs=1e-12)


def test_kl_k3_values_and_penalty() -> None:
    # ref - lp = [-0.5, 1.0]: e^-0.5 + 0.5 - 1 = 0.10653065971263342, e - 2 = 0.7182818284590451
    k3 = kl_k3(torch.tensor([-1.0, -2.0], dtype=torch.float64), torch.tensor([-1.5, -1.0], dtype=torch.float64))
    assert k3.tolist() == pytest.approx([0.10653065971263342, 0.7182818284590451], abs=1e-12)
    base, _, _ = _run("cross_entropy", [-1.0, -2.0], weights=[1.0, 1.0])
    with_kl, _, metrics = _run("cross_entropy", [-1.0, -2.0], {"kl_coef": 0.1}, ref=[-1.5, -1.0], weights=[1.0, 1.0])
    assert with_kl - base == pytest.approx(0.08248124881716787, abs=1e-12)
    assert metrics["kl_mean"] == pytest.approx(0.41240624408583934, abs=1e-12)


def test_placeholder_logprobs_on_masked_tokens_never_make_nan() -> None:
    # A huge placeholder gap on a masked token would overflow exp() and give inf * 0 = NaN.
    loss, grad, _ = _run(
        "importance_sampling", [-1.0, -5.0], logprobs=[-1.0, -1e6], advantages=[1.0, 0.0], weights=[1.0, 0.0]
    )
    assert loss == pytest.approx(-1.0)
    assert all(math.isfinite(g) for g in grad)


def test_unknown_loss_lists_the_known_ones() -> None:
    with pytest.raises(ValueError) as info:
        get_loss("grpo")
    for name in LOSSES:
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("name", "config", "match"),
    [
        ("ppo", {"clip_high_threshold": 0.2}, "ratio >= 1"),
        ("ppo", {"clip_low_threshold": 0.2 - 0.4}, r"ratio in \(0, 1\]"),
        ("importance_sampling", {"tis_cap": 0.5}, "tis_cap"),
        ("importance_sampling", {"clip_low_threshold": 0.8}, "not used by loss 'importance_sampling'"),
        ("cross_entropy", {"kl_coef": -1.0}, "kl_coef"),
        ("cispo", {"clip_high_threshold": float("nan")}, "finite"),
        ("dro", {"beta": -0.1}, "beta"),
        ("stable_reinforce", {"kl_coeff": -1.0}, "kl_coeff"),
        ("stable_reinforce", {"tis_cap": 0.5}, "tis_cap"),
    ],
)
def test_bad_loss_config_is_refused_with_the_key(name: str, config: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        resolve_config(get_loss(name), config)
