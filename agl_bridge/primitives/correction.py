"""Rollout correction: the weight that makes tokens the sampler drew count as if the trainer's policy drew them.

The sampler and the trainer compute logprobs differently (another kernel, dtype or backend; an older
policy version with `max_staleness`), so the tokens come from the sampler's π_s, not from the policy
π_prox the loss treats as the behaviour policy. Each token's log-ratio is ``log r_t = prox_t − s_t``;
from it the correction builds a stop-gradient weight ``c`` per token (verl's "rollout correction"):

* level ``token``: ``r_t``; level ``sequence``: ``R = Π_t r_t`` over the sequence's trained tokens,
  the same for each of them (unbiased, but its variance grows with length);
* truncation (TIS, ``tis_cap = C``): ``min(r, C)``;
* masking (MIS, ``mis_low`` / ``mis_high``): weight 0 where the ratio of the level leaves
  [low, high] (a missing bound is no bound), the ratio itself elsewhere;
* the geometric-mean filter (``geo_low`` / ``geo_high``): weight 0 for every token of a sequence
  whose ``exp(mean_t log r_t)`` leaves [low, high] — length-independent, so it catches sequences
  that drifted as a whole without punishing long ones.

Log-ratios are bounded to ±`LOG_RATIO_BOUND` before ``exp`` (a safety bound, as in verl) so a
sequence-level product can never overflow; inactive positions (weight 0) count as ratio 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch

CorrectionLevel = Literal["token", "sequence"]
"""The level importance weights and MIS bounds apply at."""

CORRECTION_LEVELS: tuple[str, ...] = ("token", "sequence")

CORRECTION_KEYS: tuple[str, ...] = ("tis_cap", "mis_low", "mis_high", "geo_low", "geo_high")
"""The loss_fn_config keys that turn a rollout correction on (any of them not None)."""

LOG_RATIO_BOUND = 20.0
"""|log ratio| is bounded to this before exp (e^20 ≈ 4.9e8): a safety bound, far beyond any sensible cap."""


def correction_configured(config: Mapping[str, Any]) -> bool:
    """Whether `config` asks for a rollout correction (truncation, masking or the geometric filter)."""
    return any(config.get(key) is not None for key in CORRECTION_KEYS)


def correction_weights(
    log_ratio: torch.Tensor, weights: torch.Tensor, config: Mapping[str, Any]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The stop-gradient weight of every token [B, L] and per-token metrics (fractions truncated / masked).

    log_ratio: ``prox − sampler`` per token (rows are sequences); weights: the datum weights (> 0 marks
    the trained tokens). config: resolved loss config (`correction_level` and the `CORRECTION_KEYS`).
    """
    active = weights > 0
    log_ratio = torch.where(active, log_ratio.detach(), 0.0).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    if config.get("correction_level", "token") == "sequence":
        level = log_ratio.sum(-1, keepdim=True).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).expand_as(log_ratio)
    else:
        level = log_ratio
    ratio = level.exp()
    weight = ratio
    metrics: dict[str, torch.Tensor] = {}
    cap = config.get("tis_cap")
    if cap is not None:
        metrics["tis_capped_frac"] = (ratio > cap).float()
        weight = weight.clamp(max=cap)
    keep = torch.ones_like(active)
    low, high = config.get("mis_low"), config.get("mis_high")
    if low is not None or high is not None:
        outside = _outside(ratio, low, high)
        metrics["mis_masked_frac"] = outside.float()
        keep = keep & ~outside
    geo_low, geo_high = config.get("geo_low"), config.get("geo_high")
    if geo_low is not None or geo_high is not None:
        tokens = active.sum(-1, keepdim=True).clamp(min=1)
        geometric = (log_ratio.sum(-1, keepdim=True) / tokens).exp().expand_as(log_ratio)
        outside = _outside(geometric, geo_low, geo_high)
        metrics["geo_masked_frac"] = outside.float()
        keep = keep & ~outside
    return torch.where(keep, weight, 0.0).detach(), metrics


def check_correction_config(loss: str, config: Mapping[str, Any]) -> None:
    """ValueError naming the key when a correction setting is out of range (bounds are ratios around 1)."""
    level = config.get("correction_level", "token")
    if level not in CORRECTION_LEVELS:
        raise ValueError(
            f"loss_fn_config['correction_level'] must be one of {', '.join(CORRECTION_LEVELS)}, got {level!r}"
        )
    for side in ("mis", "geo"):
        low, high = config.get(f"{side}_low"), config.get(f"{side}_high")
        if low is not None and not 0 < low <= 1:
            raise ValueError(f"loss_fn_config['{side}_low'] must be a ratio in (0, 1], e.g. 0.5, got {low}")
        if high is not None and high < 1:
            raise ValueError(f"loss_fn_config['{side}_high'] must be a ratio >= 1, e.g. 2.0, got {high}")
    if loss == "gspo" and level == "token":
        raise ValueError(
            "loss_fn_config['correction_level'] = 'token' cannot be used with loss_fn 'gspo': GSPO's ratio is one "
            "per sequence, and token weights would undo that; use correction_level = 'sequence'"
        )


def _outside(values: torch.Tensor, low: float | None, high: float | None) -> torch.Tensor:
    below = values < low if low is not None else torch.zeros_like(values, dtype=torch.bool)
    above = values > high if high is not None else torch.zeros_like(values, dtype=torch.bool)
    return below | above
