"""The built-in per-token losses, with Tinker's names and meanings.

Every loss is a SUM over tokens (times each token's weight); how a batch is aggregated (per token,
per sequence, per group) is the training loop's choice, made by scaling weights/advantages. Each
loss gets the trainer's per-token logprobs ``lp`` (with grad) and the datum's inputs as tensors of
the same shape (``weights`` always present, zero on padding), and returns the scalar loss plus
per-token metric values that the client averages over tokens with weight > 0.

Ratios: ``ρ = exp(lp − sampler_lp)`` (or ``lp − old_logprobs`` for ppo/cispo when the datum has
``old_logprobs``). ``sg`` is stop-gradient.

* ``cross_entropy``: −Σ w·lp.
* ``importance_sampling``: −Σ w·ρ·A. With ``tis_cap=C`` (truncated importance sampling):
  −Σ w·sg(min(ρ, C))·lp·A — the same gradient where ρ ≤ C, truncated above (its *value* differs:
  it is a surrogate whose gradient is the point).
* ``ppo``: −Σ w·min(ρA, clip(ρ, low, high)·A); thresholds are ratios (default 0.8 / 1.2; clip-higher
  e.g. 0.8 / 1.28).
* ``cispo``: −Σ w·sg(clip(ρ, low, high))·A·lp.
* Any loss: ``kl_coef`` > 0 adds kl_coef·Σ w·k3 with k3 = exp(ref − lp) − (ref − lp) − 1 against the
  reference (base) model's logprobs.

For ppo/cispo with ``old_logprobs`` given, ``tis_cap`` weights each token by sg(min(exp(old −
sampler_lp), C)) to correct the sampler/old-policy mismatch; without ``old_logprobs`` the old
policy *is* the sampler and the cap has nothing to do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from agl_bridge.train.datum import (
    ADVANTAGES,
    LOGPROBS,
    OLD_LOGPROBS,
    TARGET_TOKENS,
    WEIGHTS,
)


@dataclass
class LossOutput:
    """A loss's scalar (summed) value and per-token metric values (averaged over active tokens)."""

    loss: torch.Tensor
    token_metrics: dict[str, torch.Tensor] = field(default_factory=dict)


LossFn = Callable[[torch.Tensor, Mapping[str, torch.Tensor], Mapping[str, Any]], LossOutput]
"""fn(lp, inputs, config) -> LossOutput; `inputs` maps loss_fn_inputs names to tensors shaped like lp."""


@dataclass(frozen=True)
class LossSpec:
    """A named loss: its function, the datum fields it needs and the config keys it accepts."""

    name: str
    fn: LossFn
    required: tuple[str, ...]
    config_defaults: Mapping[str, Any]


def cross_entropy(lp: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> LossOutput:
    """−Σ w·lp: supervised learning on the weighted targets."""
    return LossOutput(-(inputs[WEIGHTS] * lp).sum())


def importance_sampling(lp: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> LossOutput:
    """−Σ w·ρ·A with ρ = exp(lp − sampler_lp); with `tis_cap` C, −Σ w·sg(min(ρ, C))·lp·A."""
    weights, advantages = inputs[WEIGHTS], inputs[ADVANTAGES]
    ratio = _ratio(lp, inputs[LOGPROBS], weights)
    cap = config.get("tis_cap")
    if cap is None:
        return LossOutput(-(weights * ratio * advantages).sum())
    coef = ratio.detach().clamp(max=cap)
    return LossOutput(
        -(weights * coef * lp * advantages).sum(),
        {"tis_capped_frac": (ratio.detach() > cap).float()},
    )


def ppo(lp: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> LossOutput:
    """−Σ w·min(ρA, clip(ρ, low, high)A), ρ against old_logprobs if given, else the sampler's."""
    weights, advantages = inputs[WEIGHTS], inputs[ADVANTAGES]
    low, high = config["clip_low_threshold"], config["clip_high_threshold"]
    ratio = _ratio(lp, inputs.get(OLD_LOGPROBS, inputs[LOGPROBS]), weights)
    objective = torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages)
    tis, metrics = _old_policy_correction(inputs, weights, config)
    # Where the clipped branch wins, the token's gradient is zero: those are the clip fractions.
    metrics["clip_low_frac"] = ((ratio.detach() < low) & (advantages < 0)).float()
    metrics["clip_high_frac"] = ((ratio.detach() > high) & (advantages > 0)).float()
    return LossOutput(-(weights * tis * objective).sum(), metrics)


def cispo(lp: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> LossOutput:
    """−Σ w·sg(clip(ρ, low, high))·A·lp: every token keeps a gradient, its weight is clipped."""
    weights, advantages = inputs[WEIGHTS], inputs[ADVANTAGES]
    low, high = config["clip_low_threshold"], config["clip_high_threshold"]
    ratio = _ratio(lp, inputs.get(OLD_LOGPROBS, inputs[LOGPROBS]), weights).detach()
    tis, metrics = _old_policy_correction(inputs, weights, config)
    metrics["clip_low_frac"] = (ratio < low).float()
    metrics["clip_high_frac"] = (ratio > high).float()
    return LossOutput(-(weights * tis * ratio.clamp(low, high) * advantages * lp).sum(), metrics)


def kl_k3(lp: torch.Tensor, ref_lp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy ‖ reference): exp(ref − lp) − (ref − lp) − 1 (>= 0)."""
    delta = ref_lp - lp
    return delta.exp() - delta - 1.0


_CLIP_DEFAULTS = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}

LOSSES: dict[str, LossSpec] = {
    spec.name: spec
    for spec in (
        LossSpec("cross_entropy", cross_entropy, (TARGET_TOKENS, WEIGHTS), {"kl_coef": 0.0}),
        LossSpec(
            "importance_sampling",
            importance_sampling,
            (TARGET_TOKENS, LOGPROBS, ADVANTAGES),
            {"tis_cap": None, "kl_coef": 0.0},
        ),
        LossSpec(
            "ppo", ppo, (TARGET_TOKENS, LOGPROBS, ADVANTAGES), {**_CLIP_DEFAULTS, "tis_cap": None, "kl_coef": 0.0}
        ),
        LossSpec(
            "cispo", cispo, (TARGET_TOKENS, LOGPROBS, ADVANTAGES), {**_CLIP_DEFAULTS, "tis_cap": None, "kl_coef": 0.0}
        ),
    )
}
"""The built-in losses by name."""


def get_loss(name: str) -> LossSpec:
    """The built-in loss called `name`; ValueError listing the known ones otherwise."""
    spec = LOSSES.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ValueError(
            f"unknown loss_fn {name!r}; known losses: {', '.join(LOSSES)} (or use forward_backward_custom for your own)"
        )
    return spec


def resolve_config(spec: LossSpec, config: Mapping[str, Any] | None) -> dict[str, Any]:
    """`config` over the loss's defaults, validated; ValueError naming the bad key and its allowed range."""
    config = dict(config or {})
    unknown = sorted(set(config) - set(spec.config_defaults))
    if unknown:
        raise ValueError(
            f"loss_fn_config key {unknown[0]!r} is not used by loss {spec.name!r}; "
            f"it accepts: {', '.join(spec.config_defaults) or 'nothing'}"
        )
    resolved = {**spec.config_defaults, **config}
    for key, value in resolved.items():
        if value is None and spec.config_defaults[key] is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise ValueError(f"loss_fn_config[{key!r}] must be a finite number, got {value!r}")
    if resolved.get("kl_coef", 0.0) < 0:
        raise ValueError(f"loss_fn_config['kl_coef'] must be >= 0, got {resolved['kl_coef']}")
    cap = resolved.get("tis_cap")
    if cap is not None and cap < 1:
        raise ValueError(
            f"loss_fn_config['tis_cap'] must be >= 1 (a cap on the ratio, e.g. 2.0), got {cap}; "
            "pass None to disable truncation"
        )
    if "clip_low_threshold" in resolved:
        low, high = resolved["clip_low_threshold"], resolved["clip_high_threshold"]
        if not 0 < low <= 1:
            raise ValueError(
                f"loss_fn_config['clip_low_threshold'] must be a ratio in (0, 1], e.g. 0.8 (not an "
                f"epsilon such as 0.2), got {low}"
            )
        if high < 1:
            raise ValueError(
                f"loss_fn_config['clip_high_threshold'] must be a ratio >= 1, e.g. 1.2 or 1.28 for "
                f"clip-higher (not an epsilon such as 0.2), got {high}"
            )
    return resolved


def compute_loss(
    spec: LossSpec,
    lp: torch.Tensor,
    inputs: Mapping[str, torch.Tensor],
    config: Mapping[str, Any],
    ref_logprobs: torch.Tensor | None = None,
) -> LossOutput:
    """Run `spec` on resolved `config`; with `ref_logprobs`, add kl_coef·Σ w·k3 and a `kl_mean` metric."""
    output = spec.fn(lp, inputs, config)
    if ref_logprobs is not None:
        k3 = kl_k3(lp, ref_logprobs)
        kl_coef = float(config.get("kl_coef", 0.0))
        if kl_coef:
            output.loss = output.loss + kl_coef * (inputs[WEIGHTS] * k3).sum()
        output.token_metrics["kl_mean"] = k3.detach()
    return output


def _ratio(lp: torch.Tensor, behaviour_lp: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    # Inactive positions (prompt, padding) hold placeholder logprobs: force their ratio to 1 so a
    # placeholder can never overflow exp() into inf·0 = NaN.
    return torch.where(weights > 0, lp - behaviour_lp, torch.zeros_like(lp)).exp()


def _old_policy_correction(
    inputs: Mapping[str, torch.Tensor], weights: torch.Tensor, config: Mapping[str, Any]
) -> tuple[torch.Tensor | float, dict[str, torch.Tensor]]:
    """sg(min(exp(old − sampler), cap)) when the datum has old_logprobs and a cap is set, else 1."""
    cap = config.get("tis_cap")
    if cap is None or OLD_LOGPROBS not in inputs:
        return 1.0, {}
    mismatch = torch.where(weights > 0, inputs[OLD_LOGPROBS] - inputs[LOGPROBS], 0.0).exp().detach()
    return mismatch.clamp(max=cap), {"tis_capped_frac": (mismatch > cap).float()}
