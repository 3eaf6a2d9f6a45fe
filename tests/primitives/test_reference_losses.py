"""Every loss and rollout correction against an independent reference, on random padded, masked batches.

The references below are written differently from `agl_bridge.primitives.losses` / `correction`: one
Python loop per sequence and per token over plain floats and scalar tensors, with the policy's
behaviour written out case by case (proximal policy, correction weight, clip) and, where it is
short, the gradient as a formula instead of autograd. Inputs are float64 with right padding,
masked tokens inside sequences, garbage logprobs/advantages on inactive positions, and
ratios spread across every threshold. Values, gradients with respect to the logprobs and the
logged fractions must agree to 1e-6.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from agl_bridge.primitives.losses import compute_loss, dpo_loss, get_loss, resolve_config
from agl_bridge.primitives.metrics import logprob_gap_stats

TOLERANCE = 1e-6
ROWS, LENGTH = 5, 11


@dataclass
class Case:
    """One random batch: tensors [ROWS, LENGTH], float64."""

    lp: torch.Tensor
    sampler: torch.Tensor
    old: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor
    ref: torch.Tensor

    def active(self, row: int) -> list[int]:
        return [t for t in range(LENGTH) if self.weights[row, t] > 0]


def random_case(seed: int, *, per_token_advantages: bool = True, spread: float = 0.6) -> Case:
    """Right-padded rows of random lengths, a masked prompt and random masked tokens inside, garbage elsewhere."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.zeros(ROWS, LENGTH, dtype=torch.float64)
    for row in range(ROWS):
        length = int(torch.randint(3, LENGTH + 1, (1,), generator=g))
        prompt = int(torch.randint(0, 3, (1,), generator=g))
        for t in range(prompt, length):
            if torch.rand(1, generator=g) > 0.2:
                weights[row, t] = 1.0
        if not (weights[row] > 0).any():
            weights[row, length - 1] = 1.0
    lp = -torch.rand(ROWS, LENGTH, generator=g, dtype=torch.float64) * 3 - 0.05
    noise = (torch.rand(ROWS, LENGTH, generator=g, dtype=torch.float64) - 0.5) * 2 * spread
    sampler = torch.where(weights > 0, lp + noise, -1e4)  # placeholders where inactive must never matter
    old = lp + (torch.rand(ROWS, LENGTH, generator=g, dtype=torch.float64) - 0.5) * spread
    if per_token_advantages:
        advantages = torch.randn(ROWS, LENGTH, generator=g, dtype=torch.float64)
    else:
        advantages = torch.randn(ROWS, 1, generator=g, dtype=torch.float64).expand(ROWS, LENGTH).clone()
    advantages = torch.where(weights > 0, advantages, 7.0)  # garbage where inactive
    ref = lp + (torch.rand(ROWS, LENGTH, generator=g, dtype=torch.float64) - 0.5)
    return Case(lp, sampler, old, advantages, weights, ref)


def production(
    name: str, case: Case, config: dict[str, Any], *, with_old: bool = False, kl: bool = False
) -> tuple[float, torch.Tensor, dict[str, float]]:
    """The production loss: value, d loss / d lp, and each per-token metric averaged over active tokens."""
    spec = get_loss(name)
    lp = case.lp.clone().requires_grad_(True)
    inputs = {"weights": case.weights, "logprobs": case.sampler, "advantages": case.advantages}
    if with_old:
        inputs["old_logprobs"] = case.old
    out = compute_loss(spec, lp, inputs, resolve_config(spec, config), case.ref if kl else None)
    out.loss.backward()
    active = case.weights > 0
    metrics = {key: float(value[active].double().mean()) for key, value in out.token_metrics.items()}
    assert lp.grad is not None
    return float(out.loss.detach()), lp.grad.clone(), metrics


# ---------------------------------------------------------------- the reference, loop by loop


def correction_of(case: Case, row: int, proximal: list[float], config: dict[str, Any]) -> tuple[list[float], dict]:
    """Per active token of `row`: the correction weight from log r = proximal − sampler, and which limits hit.

    Written from the definitions: token level uses r_t, sequence level R = Π r_t; truncate at tis_cap;
    zero outside [mis_low, mis_high] (by the level's ratio) or when exp(mean log r) leaves [geo_low, geo_high].
    """
    active = case.active(row)
    logs = [min(max(proximal[i] - float(case.sampler[row, t]), -20.0), 20.0) for i, t in enumerate(active)]
    sequence = "sequence" == config.get("correction_level", "token")
    total = min(max(sum(logs), -20.0), 20.0)
    weights, flags = [], {"capped": [], "mis": [], "geo": []}
    geometric = math.exp(sum(logs) / len(logs))
    for log_r in logs:
        ratio = math.exp(total) if sequence else math.exp(log_r)
        weight = ratio
        cap = config.get("tis_cap")
        flags["capped"].append(cap is not None and ratio > cap)
        if cap is not None and ratio > cap:
            weight = cap
        low, high = config.get("mis_low"), config.get("mis_high")
        masked = (low is not None and ratio < low) or (high is not None and ratio > high)
        flags["mis"].append(masked)
        glow, ghigh = config.get("geo_low"), config.get("geo_high")
        geo_masked = (glow is not None and geometric < glow) or (ghigh is not None and geometric > ghigh)
        flags["geo"].append(geo_masked)
        weights.append(0.0 if masked or geo_masked else weight)
    return weights, flags


def reference(
    name: str, case: Case, config: dict[str, Any], *, with_old: bool = False, kl: bool = False
) -> tuple[torch.Tensor, dict[str, list[bool]]]:
    """The loss as a scalar tensor built token by token from leaf `case.lp` (which must require grad)."""
    corrected = any(config.get(k) is not None for k in ("tis_cap", "mis_low", "mis_high", "geo_low", "geo_high"))
    spec_defaults = get_loss(name).config_defaults
    low = config.get("clip_low_threshold", spec_defaults.get("clip_low_threshold"))
    high = config.get("clip_high_threshold", spec_defaults.get("clip_high_threshold"))
    merged = {"correction_level": spec_defaults.get("correction_level", "token"), **config}
    lp, values = case.lp, case.lp.detach()
    total = torch.zeros((), dtype=torch.float64)
    flags: dict[str, list[bool]] = {"capped": [], "mis": [], "geo": [], "clip_low": [], "clip_high": []}
    for row in range(ROWS):
        active = case.active(row)
        if name == "cross_entropy":
            for t in active:
                total = total - case.weights[row, t] * lp[row, t]
            continue
        # The behaviour policy the loss's ratio is taken against.
        if name == "importance_sampling":
            proximal = [float(case.sampler[row, t]) for t in active]
        elif with_old:
            proximal = [float(case.old[row, t]) for t in active]
        elif corrected:
            proximal = [float(values[row, t]) for t in active]
        else:
            proximal = [float(case.sampler[row, t]) for t in active]
        if corrected:
            behaviour = proximal if name != "importance_sampling" else [float(values[row, t]) for t in active]
            weights, row_flags = correction_of(case, row, behaviour, merged)
            for key in ("capped", "mis", "geo"):
                flags[key] += row_flags[key]
        else:
            weights = [1.0] * len(active)
        if name == "gspo":
            mean_log = sum(float(values[row, t]) - proximal[i] for i, t in enumerate(active)) / len(active)
            sequence_ratio = math.exp(mean_log)
        for i, t in enumerate(active):
            w, a, c = case.weights[row, t], float(case.advantages[row, t]), weights[i]
            if name == "importance_sampling":
                term = c * lp[row, t] * a if corrected else torch.exp(lp[row, t] - proximal[i]) * a
            elif name in ("ppo", "gspo"):
                if name == "ppo":
                    ratio = torch.exp(lp[row, t] - proximal[i])
                else:  # value: the sequence's ratio; gradient: the ratio times d lp_t
                    ratio = sequence_ratio * torch.exp(lp[row, t] - float(values[row, t]))
                value = ratio.item()
                flags["clip_low"].append(value < low and a < 0)
                flags["clip_high"].append(value > high and a > 0)
                clipped = min(max(value, low), high)
                unclipped_term = ratio * a
                term = unclipped_term if unclipped_term.item() <= clipped * a else torch.tensor(clipped * a)
                term = c * term
            elif name == "cispo":
                value = math.exp(float(values[row, t]) - proximal[i])
                flags["clip_low"].append(value < low)
                flags["clip_high"].append(value > high)
                term = c * min(max(value, low), high) * a * lp[row, t]
            else:
                raise AssertionError(name)
            total = total - w * term
    if kl:
        for row in range(ROWS):
            for t in case.active(row):
                delta = case.ref[row, t] - lp[row, t]
                total = total + config["kl_coef"] * case.weights[row, t] * (torch.exp(delta) - delta - 1)
    return total, flags


def check(name: str, case: Case, config: dict[str, Any], **kwargs: bool) -> dict[str, float]:
    value, grad, metrics = production(name, case, config, **kwargs)
    leaf = case.lp.clone().requires_grad_(True)
    expected, flags = reference(
        name, Case(leaf, case.sampler, case.old, case.advantages, case.weights, case.ref), config, **kwargs
    )
    expected.backward()
    assert leaf.grad is not None
    assert abs(value - expected.item()) <= TOLERANCE, (value, expected.item())
    assert float((grad - leaf.grad).abs().max()) <= TOLERANCE
    assert float(grad[case.weights == 0].abs().max()) == 0.0, "inactive tokens get no gradient"
    names = {"capped": "tis_capped_frac", "mis": "mis_masked_frac", "geo": "geo_masked_frac"}
    names |= {"clip_low": "clip_low_frac", "clip_high": "clip_high_frac"}
    for key, metric in names.items():
        if metric in metrics:
            assert metrics[metric] == pytest.approx(sum(flags[key]) / len(flags[key]), abs=TOLERANCE), metric
        else:
            assert not any(flags[key]), f"{metric} was not logged"
    return metrics


CORRECTIONS = [
    {},
    {"tis_cap": 1.2},
    {"tis_cap": 1.5, "correction_level": "sequence"},
    {"mis_low": 0.8, "mis_high": 1.25},
    {"mis_high": 1.6, "correction_level": "sequence"},
    {"tis_cap": 1.3, "mis_low": 0.7},
    {"geo_low": 0.95, "geo_high": 1.05},
    {"tis_cap": 2.0, "geo_high": 1.04, "correction_level": "sequence"},
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("correction", CORRECTIONS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "none")
def test_importance_sampling_with_every_correction(seed: int, correction: dict[str, Any]) -> None:
    case = random_case(seed)
    check("importance_sampling", case, correction)
    # The gradient written as a formula too: −w·c·A for a corrected loss, −w·ρ·A for the plain one.
    _, grad, _ = production("importance_sampling", case, correction)
    for row in range(ROWS):
        active = case.active(row)
        if correction:
            weights, _ = correction_of(case, row, [float(case.lp[row, t]) for t in active], correction)
        else:
            weights = [math.exp(float(case.lp[row, t] - case.sampler[row, t])) for t in active]
        for i, t in enumerate(active):
            assert float(grad[row, t]) == pytest.approx(-weights[i] * float(case.advantages[row, t]), abs=TOLERANCE)


@pytest.mark.parametrize("correction", [c for c in CORRECTIONS if c], ids=lambda c: ",".join(map(str, c.values())))
def test_every_limit_bites_on_these_inputs(correction: dict[str, Any]) -> None:
    """The cases above are not vacuous: each truncation or mask changes some token on some seed."""
    hits = 0.0
    for seed in range(3):
        metrics = production("importance_sampling", random_case(seed), correction)[2]
        hits += sum(metrics.get(key, 0.0) for key in ("tis_capped_frac", "mis_masked_frac", "geo_masked_frac"))
    assert hits > 0


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", ["ppo", "cispo"])
@pytest.mark.parametrize(
    ("correction", "with_old"),
    [({}, False), ({}, True), ({"tis_cap": 1.2}, True), ({"tis_cap": 1.2}, False), (CORRECTIONS[4], False)],
    ids=["bypass", "old", "old+tis", "decoupled+tis", "decoupled+seq-mis"],
)
def test_clipped_losses(seed: int, name: str, correction: dict[str, Any], with_old: bool) -> None:
    config = {"clip_low_threshold": 0.85, "clip_high_threshold": 1.2, **correction}
    metrics = check(name, random_case(seed), config, with_old=with_old)
    if not correction and not with_old:
        assert metrics["clip_low_frac"] + metrics["clip_high_frac"] > 0, "some ratios must be clipped"


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize(
    ("config", "with_old"),
    [
        ({"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}, False),
        ({}, False),  # GSPO's own 3e-4 / 4e-4
        ({"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}, True),
        ({"clip_low_threshold": 0.9, "clip_high_threshold": 1.1, "tis_cap": 1.5}, False),
        ({"tis_cap": 2.0, "geo_low": 0.97, "mis_high": 3.0}, True),
    ],
    ids=["bypass", "paper-clip", "old", "decoupled+seq-tis", "old+seq-tis+mis+geo"],
)
def test_gspo_token_form_with_per_token_advantages(seed: int, config: dict[str, Any], with_old: bool) -> None:
    case = random_case(seed, spread=0.3)
    check("gspo", case, config, with_old=with_old)
    # The gradient as a formula: −w·c·s·A where the clipped branch is not the minimum, else 0.
    _, grad, _ = production("gspo", case, config, with_old=with_old)
    low = config.get("clip_low_threshold", 1 - 3e-4)
    high = config.get("clip_high_threshold", 1 + 4e-4)
    corrected = any(k in config for k in ("tis_cap", "mis_high", "geo_low"))
    for row in range(ROWS):
        active = case.active(row)
        source = case.old if with_old else (case.lp if corrected else case.sampler)
        proximal = [float(source[row, t]) for t in active]
        s = math.exp(sum(float(case.lp[row, t]) - proximal[i] for i, t in enumerate(active)) / len(active))
        weights = (
            correction_of(case, row, proximal, {"correction_level": "sequence", **config})[0] if corrected else None
        )
        for i, t in enumerate(active):
            a = float(case.advantages[row, t])
            c = weights[i] if weights is not None else 1.0
            flat = (a > 0 and s > high) or (a < 0 and s < low)
            assert float(grad[row, t]) == pytest.approx(0.0 if flat else -c * s * a, abs=TOLERANCE)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gspo_is_the_sequence_objective_with_one_advantage_per_sequence(seed: int) -> None:
    """With A constant per sequence and 0/1 weights, GSPO-token equals GSPO's sequence objective
    −Σ_i n_i·min(s_i·A_i, clip(s_i)·A_i), its gradient flowing through s_i = exp(mean log-ratio)."""
    case = random_case(seed, per_token_advantages=False, spread=0.3)
    config = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
    value, grad, _ = production("gspo", case, config)
    leaf = case.lp.clone().requires_grad_(True)
    total = torch.zeros((), dtype=torch.float64)
    for row in range(ROWS):
        active = case.active(row)
        n = len(active)
        s = torch.exp(sum(leaf[row, t] - case.sampler[row, t] for t in active) / n)
        a = float(case.advantages[row, active[0]])
        total = total - n * torch.minimum(s * a, s.clamp(0.9, 1.1) * a)
    total.backward()
    assert leaf.grad is not None
    assert abs(value - total.item()) <= TOLERANCE
    assert float((grad - leaf.grad).abs().max()) <= TOLERANCE


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("beta", [0.0, 0.05, 1.5])
def test_dro_by_loops(seed: int, beta: float) -> None:
    """DRO token by token: −Σ w·(lp·A − β/2·(lp − s)²), and its gradient −w·(A − β·(lp − s)) as a formula."""
    case = random_case(seed)
    value, grad, metrics = production("dro", case, {"beta": beta})
    expected, penalty, count = 0.0, 0.0, 0
    for row in range(ROWS):
        for t in case.active(row):
            lp, sampler = float(case.lp[row, t]), float(case.sampler[row, t])
            advantage, weight = float(case.advantages[row, t]), float(case.weights[row, t])
            expected -= weight * (lp * advantage - beta / 2 * (lp - sampler) ** 2)
            penalty += 0.5 * (lp - sampler) ** 2
            count += 1
            assert float(grad[row, t]) == pytest.approx(-weight * (advantage - beta * (lp - sampler)), abs=TOLERANCE)
    assert value == pytest.approx(expected, abs=TOLERANCE)
    assert metrics["dro_penalty"] == pytest.approx(penalty / count, abs=TOLERANCE)
    assert float(grad[case.weights == 0].abs().max()) == 0.0, "inactive tokens get no gradient"


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("cap", "kappa"), [(2.0, 0.0), (1.1, 0.3)])
def test_stable_reinforce_by_loops(seed: int, cap: float, kappa: float) -> None:
    """Token by token: −Σ w·min(ρ, C)·A·lp + κ·Σ w·(ρ − 1 − log ρ), gradient −w·(min(ρ, C)·A − κ·(ρ − 1))."""
    case = random_case(seed)
    value, grad, metrics = production("stable_reinforce", case, {"tis_cap": cap, "kl_coeff": kappa})
    expected, capped, count = 0.0, 0, 0
    for row in range(ROWS):
        for t in case.active(row):
            lp, sampler = float(case.lp[row, t]), float(case.sampler[row, t])
            advantage, weight = float(case.advantages[row, t]), float(case.weights[row, t])
            ratio = math.exp(lp - sampler)
            kept = ratio if ratio <= cap else cap
            expected += -weight * kept * advantage * lp + kappa * weight * (ratio - 1 - (lp - sampler))
            capped += ratio > cap
            count += 1
            assert float(grad[row, t]) == pytest.approx(
                -weight * (kept * advantage - kappa * (ratio - 1)), abs=TOLERANCE
            )
    assert value == pytest.approx(expected, abs=TOLERANCE)
    assert metrics["tis_capped_frac"] == pytest.approx(capped / count, abs=TOLERANCE)
    assert float(grad[case.weights == 0].abs().max()) == 0.0, "inactive tokens get no gradient"


@pytest.mark.parametrize("name", ["cross_entropy", "importance_sampling", "ppo", "gspo"])
def test_kl_penalty(name: str) -> None:
    config: dict[str, Any] = {"kl_coef": 0.3}
    if name in ("ppo", "gspo"):
        config |= {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
    check(name, random_case(5), config, kl=True)


def test_safety_bound_keeps_sequence_weights_finite() -> None:
    case = random_case(0)
    case.sampler = torch.where(case.weights > 0, case.lp - 5.0, case.sampler)  # log r = 5 per token
    for config in ({"mis_low": 0.5, "correction_level": "sequence"}, {"geo_high": 1e9, "correction_level": "sequence"}):
        value, grad, _ = production("importance_sampling", case, config)
        assert math.isfinite(value) and bool(torch.isfinite(grad).all())
        check("importance_sampling", case, config)


def test_logprob_gap_statistics_by_loops() -> None:
    case = random_case(4)
    active = case.weights > 0
    trainer, sampler = case.lp[active], case.sampler[active]
    stats = logprob_gap_stats(trainer, sampler)
    diffs = [float(a) - float(b) for a, b in zip(trainer, sampler, strict=True)]
    assert stats["sampler_kl_k1"] == pytest.approx(sum(-d for d in diffs) / len(diffs), abs=TOLERANCE)
    k3 = [math.exp(d) - 1 - d for d in diffs]
    assert stats["sampler_kl_k3"] == pytest.approx(sum(k3) / len(k3), abs=TOLERANCE)
    assert stats["sampler_kl_k3"] >= 0
    assert stats["ratio_max"] == pytest.approx(max(math.exp(d) for d in diffs), abs=TOLERANCE)
    assert stats["ratio_mean"] == pytest.approx(sum(math.exp(d) for d in diffs) / len(diffs), abs=TOLERANCE)


@pytest.mark.parametrize("seed", [0, 1])
def test_dpo_loss_by_loops(seed: int) -> None:
    """Pairs spread over several datums per side, out of order; value, gradients and metrics by hand."""
    from agl_bridge.primitives import Datum

    g = torch.Generator().manual_seed(seed)
    beta = 0.3
    # (pair, chosen) of each datum: pair 1's rejected side spans two datums.
    layout = [(0, True), (1, False), (0, False), (1, True), (1, False), (2, True), (2, False)]
    data, logprobs = [], []
    for pair, chosen in layout:
        n = int(torch.randint(3, 8, (1,), generator=g))
        weights = (torch.rand(n, generator=g) > 0.3).double().tolist()
        ref = (-torch.rand(n, generator=g, dtype=torch.float64) * 2).tolist()
        inputs = {
            "target_tokens": [1] * n,
            "weights": weights,
            "ref_logprobs": ref,
            "dpo_pair": pair,
            "dpo_chosen": chosen,
        }
        data.append(Datum([1] * n, inputs))
        logprobs.append((-torch.rand(n, generator=g, dtype=torch.float64) * 2).requires_grad_(True))
    loss, metrics = dpo_loss(beta)(data, logprobs)
    loss.backward()

    sums: dict[tuple[int, bool], float] = {}
    for (pair, chosen), datum, lp in zip(layout, data, logprobs, strict=True):
        inputs = datum.loss_fn_inputs
        delta = sum(
            w * (float(x) - r) for w, x, r in zip(inputs["weights"], lp.detach(), inputs["ref_logprobs"], strict=True)
        )
        sums[(pair, chosen)] = sums.get((pair, chosen), 0.0) + beta * delta
    margins = [sums[(p, True)] - sums[(p, False)] for p in range(3)]
    expected = sum(math.log1p(math.exp(-m)) for m in margins) / 3  # −log σ(m) = log(1 + e^−m)
    assert float(loss.detach()) == pytest.approx(expected, abs=TOLERANCE)
    assert metrics["accuracy"] == pytest.approx(sum(m > 0 for m in margins) / 3)
    assert metrics["margin"] == pytest.approx(sum(margins) / 3, abs=TOLERANCE)
    assert metrics["chosen_reward"] == pytest.approx(sum(sums[(p, True)] for p in range(3)) / 3, abs=TOLERANCE)
    # d loss / d lp_t = −(1/3)·σ(−m)·β·w_t·(+1 chosen, −1 rejected)
    for (pair, chosen), datum, lp in zip(layout, data, logprobs, strict=True):
        sigma = 1 / (1 + math.exp(margins[pair]))
        for w, g_t in zip(datum.loss_fn_inputs["weights"], lp.grad, strict=True):
            assert float(g_t) == pytest.approx(-sigma * beta * w * (1 if chosen else -1) / 3, abs=TOLERANCE)
