"""Training-step metrics: the trainer/sampler logprob gap and per-token loss statistics.

The gap statistics are the health check of the whole pipeline: sampler and trainer compute the same
quantity (raw logprobs), so on the first on-policy step ``ratio_mean`` ≈ 1 and
``logprob_diff_abs_max`` is float noise; anything larger means the recorded tokens/logprobs do not
match what the trainer scores (wrong template, truncation, stale weights, a dtype problem).
"""

from __future__ import annotations

import math
from typing import Any

import torch


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson correlation of two 1-D tensors (NaN with fewer than 2 values or zero variance)."""
    if x.numel() < 2:
        return math.nan
    x = x.double() - x.double().mean()
    y = y.double() - y.double().mean()
    denominator = (x.square().sum() * y.square().sum()).sqrt()
    if denominator == 0:
        return math.nan
    return float((x * y).sum() / denominator)


GAP_KEYS = (
    "ratio_mean",
    "ratio_max",
    "logprob_diff_mean",
    "logprob_diff_abs_mean",
    "logprob_diff_abs_max",
    "prob_pearson",
    "sampler_kl_k1",
    "sampler_kl_k3",
)
"""The keys of `logprob_gap_stats`."""


def logprob_gap_stats(trainer_lp: torch.Tensor, sampler_lp: torch.Tensor) -> dict[str, float]:
    """How far the trainer's logprobs are from the sampler's, over the given (active) tokens.

    ratio_mean / ratio_max: mean / max of the ratio r = exp(trainer − sampler); logprob_diff_mean:
    mean signed difference; logprob_diff_abs_mean / _max: mean / max |difference|; prob_pearson:
    correlation of the token probabilities exp(lp) between the two; sampler_kl_k1 / sampler_kl_k3:
    the k1 (mean of −log r) and k3 (mean of r − 1 − log r, never negative) estimates of
    KL(sampler ‖ trainer) over the sampled tokens. All NaN when there are no tokens.
    """
    if trainer_lp.numel() == 0:
        return dict.fromkeys(GAP_KEYS, math.nan)
    diff = trainer_lp.double() - sampler_lp.double()
    ratio = diff.exp()
    return {
        "ratio_mean": float(ratio.mean()),
        "ratio_max": float(ratio.max()),
        "logprob_diff_mean": float(diff.mean()),
        "logprob_diff_abs_mean": float(diff.abs().mean()),
        "logprob_diff_abs_max": float(diff.abs().max()),
        "prob_pearson": pearson(trainer_lp.exp(), sampler_lp.exp()),
        "sampler_kl_k1": float(-diff.mean()),
        "sampler_kl_k3": float((ratio - 1 - diff).mean()),
    }


def token_entropy(logprobs: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of each position's distribution, from full-vocabulary logprobs [..., V]."""
    return -(logprobs.exp() * logprobs).sum(-1)


class StepMetrics:
    """Accumulates one forward/forward_backward call's statistics over its micro-batches."""

    def __init__(self) -> None:
        self.loss = 0.0
        self.num_datums = 0
        self.tokens = 0
        self._sums: dict[str, float] = {}
        self._trainer_lp: list[torch.Tensor] = []
        self._sampler_lp: list[torch.Tensor] = []
        self._entropy_sum = 0.0

    def add_tokens(self, active: torch.Tensor, entropy: torch.Tensor | None) -> None:
        """Count a micro-batch's active tokens (weight > 0) and their entropy."""
        self.tokens += int(active.sum())
        if entropy is not None:
            self._entropy_sum += float(entropy[active].sum())

    def add_gap(self, mask: torch.Tensor, trainer_lp: torch.Tensor, sampler_lp: torch.Tensor) -> None:
        """Record trainer vs sampler logprobs at `mask` (active tokens of data that carry sampler logprobs)."""
        self._trainer_lp.append(trainer_lp.detach()[mask].float().cpu())
        self._sampler_lp.append(sampler_lp.detach()[mask].float().cpu())

    def add_token_metrics(self, active: torch.Tensor, values: dict[str, torch.Tensor]) -> None:
        """Add per-token metric values; each is reported as its mean over active tokens."""
        for name, tensor in values.items():
            self._sums[name] = self._sums.get(name, 0.0) + float(tensor.detach()[active].double().sum())

    def state(self) -> dict[str, Any]:
        """The accumulated sums as plain data and tensors (what another rank sends; see `from_state`)."""
        return dict(vars(self))

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> StepMetrics:
        """The metrics another rank accumulated, from its `state()`."""
        metrics = cls()
        unknown = set(state) - set(vars(metrics))
        if unknown:
            raise ValueError(f"not a StepMetrics state: unknown fields {sorted(unknown)}")
        vars(metrics).update(state)
        return metrics

    def merge(self, other: StepMetrics) -> None:
        """Add another share of the same call (another rank's datums): the result is the whole call's."""
        self.loss += other.loss
        self.num_datums += other.num_datums
        self.tokens += other.tokens
        for name, total in other._sums.items():
            self._sums[name] = self._sums.get(name, 0.0) + total
        self._trainer_lp += other._trainer_lp
        self._sampler_lp += other._sampler_lp
        self._entropy_sum += other._entropy_sum

    def result(self, extra: dict[str, float] | None = None) -> dict[str, float]:
        """The metrics dict: loss, tokens, datums, per-token means, gap statistics, entropy."""
        out: dict[str, float] = {"loss": self.loss, "tokens": float(self.tokens), "num_datums": float(self.num_datums)}
        denominator = max(self.tokens, 1)
        for name, total in self._sums.items():
            out[name] = total / denominator
        if self._trainer_lp:
            out.update(logprob_gap_stats(torch.cat(self._trainer_lp), torch.cat(self._sampler_lp)))
        out["entropy_mean"] = self._entropy_sum / denominator if self.tokens else math.nan
        out.update(extra or {})
        return out
