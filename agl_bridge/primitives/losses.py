"""The built-in per-token losses, with Tinker's names and meanings, plus GSPO and the DPO objective.

Every loss is a SUM over tokens (times each token's weight); how a batch is aggregated (per token,
per sequence, per group) is the training loop's choice, made by scaling weights/advantages. Each
loss gets the trainer's per-token logprobs ``lp`` (with grad) and the datum's inputs as tensors of
the same shape (``weights`` always present, zero on padding), and returns the scalar loss plus
per-token metric values that the client averages over tokens with weight > 0. Rows are whole
datums (micro-batches split between datums), so a loss may work per sequence.

Ratios: ``ρ = exp(lp − prox)`` against the behaviour ("proximal") policy ``prox``: for
importance_sampling the sampler's logprobs; for ppo/cispo/gspo ``old_logprobs`` when the datum has
them, else — with a rollout correction configured — the trainer's own current logprobs, detached
(verl's decoupled mode: one update per batch, so they are the old policy), else the sampler's
(bypass mode: the clip bounds the sampler/trainer ratio itself). ``sg`` is stop-gradient.

* ``cross_entropy``: −Σ w·lp.
* ``importance_sampling``: −Σ w·ρ·A. With a rollout correction (`correction.py`: ``tis_cap``
  truncation, MIS masking, the geometric filter; token or sequence level): −Σ w·c·lp·A with
  ``c = sg(correction(ρ))`` — the same gradient where nothing is truncated or masked (its *value*
  is a surrogate whose gradient is the point). ``tis_cap=C`` alone is today's token TIS.
* ``ppo``: −Σ w·c·min(ρA, clip(ρ, low, high)·A); thresholds are ratios (default 0.8 / 1.2;
  clip-higher e.g. 0.8 / 1.28).
* ``cispo``: −Σ w·c·sg(clip(ρ, low, high))·A·lp.
* ``gspo`` (GSPO, token form): per sequence ``s = exp(mean_t (lp_t − prox_t))`` over its trained
  tokens, ``s_t = sg(s)·exp(lp_t − sg(lp_t))``, loss −Σ w·c·min(s_t·A, clip(s_t, low, high)·A) —
  clipped per sequence (every token of a sequence has the value s). With one advantage per sequence
  it is GSPO's sequence objective times the sequence's trained tokens (``aggregation =
  "sequence_mean"`` gives GSPO exactly); per-token advantages (distillation) keep their credit.
  Default thresholds 1 − 3e-4 / 1 + 4e-4 (the paper's).
* ``dro`` (Direct Reward Optimization, Tinker's form): −Σ w·(lp·A − β/2·(lp − s)²) with ``s`` the
  sampler's logprobs; the gradient per token is −A + β·(lp − s), a pull back towards the sampler
  instead of a ratio clip. ``beta`` defaults to 0.05 (Tinker's documented example).
* ``stable_reinforce`` (ours; Tinker has not published its objective, only the interface): REINFORCE
  with a truncated importance weight against the sampler, plus an optional pull towards it:
  −Σ w·sg(min(ρ, C))·A·lp + κ·Σ w·(ρ − 1 − log ρ), ρ = exp(lp − s). The gradient per token is
  −min(ρ, C)·A + κ·(ρ − 1); the second term is the k3 estimate of KL(sampler ‖ policy) on the
  sampled tokens. ``tis_cap`` C defaults to 2, ``kl_coeff`` κ (Tinker's key) to 0.
* Any loss: ``kl_coef`` > 0 adds kl_coef·Σ w·k3 with k3 = exp(ref − lp) − (ref − lp) − 1 against the
  reference (base) model's logprobs.

The rollout correction weight ``c`` is 1 unless configured; for ppo/cispo/gspo it is computed from
``prox − sampler``, so in bypass mode it has nothing to correct. `dpo_loss` builds the DPO
objective for `forward_backward_custom`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from agl_bridge.primitives.correction import (
    CORRECTION_KEYS,
    check_correction_config,
    correction_configured,
    correction_weights,
)
from agl_bridge.primitives.datum import (
    ADVANTAGES,
    LOGPROBS,
    OLD_LOGPROBS,
    TARGET_TOKENS,
    WEIGHTS,
)

if TYPE_CHECKING:
    from agl_bridge.primitives.datum import Datum


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
    """−Σ w·ρ·A with ρ = exp(lp − sampler_lp); with a rollout correction c(ρ), −Σ w·sg(c)·lp·A."""
    weights, advantages = inputs[WEIGHTS], inputs[ADVANTAGES]
    if not correction_configured(config):
        return LossOutput(-(weights * _ratio(lp, inputs[LOGPROBS], weights) * advantages).sum())
    coef, metrics = correction_weights(lp - inputs[LOGPROBS], weights, config)
    return LossOutput(-(weights * coef * lp * advantages).sum(), metrics)


def ppo(lp: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> LossOutput:
    """−Σ w·c·min(ρA, clip(ρ, low, high)A), ρ against the proximal policy (see the module docs)."""
    weights, advantages = inputs[WEIGHTS], inputs[ADVANTAGES]
    low, high = config["clip_low_threshold"], config["clip_high_threshold"]
    proximal = _proximal(lp, inputs, config)
    ratio = _ratio(lp, proximal, weights)
    objective = torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages)
    coef, metrics = _rollout_correction(proximal, inputs, weights, config)
    metrics.update(_clip_fractions(ratio.detach(), advantages, low, high))
    return LossOutput(-(weights * coef * objective).sum(), metrics)


def cispo(lp: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> LossOutput:
    """−Σ w·c·sg(clip(ρ, low, high))·A·lp: every token keeps a gradient, its weight is clipped."""
    weights, advantages = inputs[WEIGHTS], inputs[ADVANTAGES]
    low, high = config["clip_low_threshold"], config["clip_high_threshold"]
    proximal = _proximal(lp, inputs, config)
    ratio = _ratio(lp, proximal, weights).detach()
    coef, metrics = _rollout_correction(proximal, inputs, weights, config)
    metrics["clip_low_frac"] = (ratio < low).float()
    metrics["clip_high_frac"] = (ratio > high).float()
    return LossOutput(-(weights * coef * ratio.clamp(low, high) * advantages * lp).sum(), metrics)


def gspo(lp: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> LossOutput:
    """GSPO (token form): the length-normalised sequence ratio s, clipped per sequence, on each token's advantage."""
    weights, advantages = inputs[WEIGHTS], inputs[ADVANTAGES]
    low, high = config["clip_low_threshold"], config["clip_high_threshold"]
    proximal = _proximal(lp, inputs, config)
    active = weights > 0
    delta = torch.where(active, lp - proximal, 0.0)
    sequence_log_ratio = delta.sum(-1, keepdim=True) / active.sum(-1, keepdim=True).clamp(min=1)
    # s_t = sg(s)·π(y_t)/sg(π(y_t)): its value is the sequence's s, its gradient s·∇lp_t.
    ratio = (sequence_log_ratio.detach() + lp - lp.detach()).exp()
    objective = torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages)
    coef, metrics = _rollout_correction(proximal, inputs, weights, config)
    metrics.update(_clip_fractions(ratio.detach(), advantages, low, high))
    return LossOutput(-(weights * coef * objective).sum(), metrics)


def dro(lp: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> LossOutput:
    """DRO: −Σ w·(lp·A − β/2·(lp − sampler_lp)²); the quadratic term holds the policy near the sampler."""
    weights, advantages = inputs[WEIGHTS], inputs[ADVANTAGES]
    # Placeholder logprobs on inactive positions must not reach the square (inf·0 = NaN).
    gap = torch.where(weights > 0, lp - inputs[LOGPROBS], torch.zeros_like(lp))
    objective = lp * advantages - 0.5 * config["beta"] * gap.square()
    return LossOutput(-(weights * objective).sum(), {"dro_penalty": 0.5 * gap.detach().square()})


def stable_reinforce(lp: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> LossOutput:
    """−Σ w·sg(min(ρ, C))·A·lp + κ·Σ w·(ρ − 1 − log ρ): truncated-weight REINFORCE held near the sampler."""
    weights, advantages = inputs[WEIGHTS], inputs[ADVANTAGES]
    log_ratio = torch.where(weights > 0, lp - inputs[LOGPROBS], torch.zeros_like(lp))
    ratio = log_ratio.exp()
    cap = config["tis_cap"]
    objective = ratio.detach().clamp(max=cap) * advantages * lp
    sampler_kl = ratio - 1.0 - log_ratio
    loss = -(weights * objective).sum() + config["kl_coeff"] * (weights * sampler_kl).sum()
    metrics = {"tis_capped_frac": (ratio.detach() > cap).float(), "sampler_kl": sampler_kl.detach()}
    return LossOutput(loss, metrics)


def kl_k3(lp: torch.Tensor, ref_lp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy ‖ reference): exp(ref − lp) − (ref − lp) − 1 (>= 0)."""
    delta = ref_lp - lp
    return delta.exp() - delta - 1.0


DPO_REF_LOGPROBS = "ref_logprobs"
"""The loss_fn_inputs key of a DPO datum's reference-model logprobs (per target, like `logprobs`)."""

DPO_PAIR = "dpo_pair"
"""The loss_fn_inputs key of a DPO datum's pair index."""

DPO_CHOSEN = "dpo_chosen"
"""The loss_fn_inputs key saying whether a DPO datum belongs to the chosen (True) or the rejected side."""


def dpo_loss(beta: float) -> Callable[[Sequence[Datum], list[torch.Tensor]], tuple[torch.Tensor, dict[str, float]]]:
    """The DPO objective for `forward_backward_custom`.

    Every datum carries `weights` (1 on the response tokens), `ref_logprobs` (the reference
    model's, e.g. from `TrainingClient.reference_logprobs`), `dpo_pair` (its pair) and `dpo_chosen`;
    a side may span several datums (a multi-segment trajectory). With ``Δ = Σ w·(lp − ref)`` summed
    over a side's datums, the implicit reward is ``β·Δ`` and the loss is the mean over pairs of
    ``−log σ(β·Δ_chosen − β·Δ_rejected)``. Metrics (means over pairs): dpo_loss, accuracy (margin
    > 0), margin, chosen_reward, rejected_reward.
    """

    def loss(data: Sequence[Datum], logprobs: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        sides: dict[tuple[int, bool], torch.Tensor] = {}
        for datum, lp in zip(data, logprobs, strict=True):
            inputs = datum.loss_fn_inputs
            weights = torch.as_tensor(inputs[WEIGHTS], dtype=lp.dtype, device=lp.device)
            reference = torch.as_tensor(inputs[DPO_REF_LOGPROBS], dtype=lp.dtype, device=lp.device)
            key = (int(inputs[DPO_PAIR]), bool(inputs[DPO_CHOSEN]))
            sides[key] = sides.get(key, 0.0) + beta * (weights * (lp - reference)).sum()
        pairs = sorted({pair for pair, _ in sides})
        lonely = [pair for pair in pairs if (pair, True) not in sides or (pair, False) not in sides]
        if lonely:
            raise ValueError(
                f"DPO pair {lonely[0]} has no {'chosen' if (lonely[0], True) not in sides else 'rejected'} datum"
            )
        chosen = torch.stack([sides[(pair, True)] for pair in pairs])
        rejected = torch.stack([sides[(pair, False)] for pair in pairs])
        margin = chosen - rejected
        value = -torch.nn.functional.logsigmoid(margin).mean()
        detached = margin.detach()
        return value, {
            "dpo_loss": float(value.detach()),
            "accuracy": float((detached > 0).double().mean()),
            "margin": float(detached.mean()),
            "chosen_reward": float(chosen.detach().mean()),
            "rejected_reward": float(rejected.detach().mean()),
        }

    return loss


_CLIP_DEFAULTS = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
_GSPO_CLIP_DEFAULTS = {"clip_low_threshold": 1 - 3e-4, "clip_high_threshold": 1 + 4e-4}
_CORRECTION_DEFAULTS: dict[str, Any] = {"correction_level": "token", **dict.fromkeys(CORRECTION_KEYS)}
_RL_INPUTS = (TARGET_TOKENS, LOGPROBS, ADVANTAGES)

LOSSES: dict[str, LossSpec] = {
    spec.name: spec
    for spec in (
        LossSpec("cross_entropy", cross_entropy, (TARGET_TOKENS, WEIGHTS), {"kl_coef": 0.0}),
        LossSpec("importance_sampling", importance_sampling, _RL_INPUTS, {**_CORRECTION_DEFAULTS, "kl_coef": 0.0}),
        LossSpec("ppo", ppo, _RL_INPUTS, {**_CLIP_DEFAULTS, **_CORRECTION_DEFAULTS, "kl_coef": 0.0}),
        LossSpec("cispo", cispo, _RL_INPUTS, {**_CLIP_DEFAULTS, **_CORRECTION_DEFAULTS, "kl_coef": 0.0}),
        LossSpec(
            "gspo",
            gspo,
            _RL_INPUTS,
            {**_GSPO_CLIP_DEFAULTS, **_CORRECTION_DEFAULTS, "correction_level": "sequence", "kl_coef": 0.0},
        ),
        # beta 0.05: Tinker's documented example (its docs give no default).
        LossSpec("dro", dro, _RL_INPUTS, {"beta": 0.05, "kl_coef": 0.0}),
        # kl_coeff (two f's) is Tinker's attested key for this loss: κ of the pull towards the sampler.
        LossSpec("stable_reinforce", stable_reinforce, _RL_INPUTS, {"tis_cap": 2.0, "kl_coeff": 0.0, "kl_coef": 0.0}),
    )
}
"""The built-in losses by name."""

_STRING_KEYS = ("correction_level",)


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
        if key in _STRING_KEYS or (value is None and spec.config_defaults[key] is None):
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise ValueError(f"loss_fn_config[{key!r}] must be a finite number, got {value!r}")
    if resolved.get("beta", 0.0) < 0:
        raise ValueError(f"loss_fn_config['beta'] must be >= 0, got {resolved['beta']}")
    for key in ("kl_coef", "kl_coeff"):
        if resolved.get(key, 0.0) < 0:
            raise ValueError(f"loss_fn_config[{key!r}] must be >= 0, got {resolved[key]}")
    cap = resolved.get("tis_cap")
    if cap is not None and cap < 1:
        raise ValueError(
            f"loss_fn_config['tis_cap'] must be >= 1 (a cap on the ratio, e.g. 2.0), got {cap}; "
            "pass None to disable truncation"
        )
    if "correction_level" in resolved:
        check_correction_config(spec.name, resolved)
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


def _proximal(lp: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> torch.Tensor:
    """A clipped loss's behaviour policy: old_logprobs; else sg(lp) when correcting (decoupled); else the sampler."""
    if OLD_LOGPROBS in inputs:
        return inputs[OLD_LOGPROBS]
    if correction_configured(config):
        return lp.detach()
    return inputs[LOGPROBS]


def _rollout_correction(
    proximal: torch.Tensor, inputs: Mapping[str, torch.Tensor], weights: torch.Tensor, config: Mapping[str, Any]
) -> tuple[torch.Tensor | float, dict[str, torch.Tensor]]:
    """The correction weight of `proximal` against the sampler when one is configured, else 1."""
    if not correction_configured(config):
        return 1.0, {}
    return correction_weights(proximal - inputs[LOGPROBS], weights, config)


def _clip_fractions(ratio: torch.Tensor, advantages: torch.Tensor, low: float, high: float) -> dict[str, torch.Tensor]:
    # Where the clipped branch wins, the token's gradient is zero: those are the clip fractions.
    return {
        "clip_low_frac": ((ratio < low) & (advantages < 0)).float(),
        "clip_high_frac": ((ratio > high) & (advantages > 0)).float(),
    }
