"""Turning one decode step's logits into chosen tokens and their raw logprobs, row by row.

Each row has its own temperature, top-k, top-p and (for seeded requests) its own generator, so a
seeded request draws the same random numbers whatever else shares its batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowSampling:
    """How to pick the next token of one row."""

    temperature: float
    top_k: int
    top_p: float
    generator: torch.Generator | None


def choose_tokens(
    logits: torch.Tensor, rows: Sequence[RowSampling], shared_generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick a token per row of `logits` ([rows, vocab]) and return (tokens, raw logprobs).

    The logprob is of the model's raw distribution (temperature 1, no truncation), see
    `agl_bridge.sampler.base`. Rows without their own generator draw from `shared_generator`.
    """
    logits = logits.float()
    raw_logprobs = torch.log_softmax(logits, dim=-1)
    tokens = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)

    greedy = [i for i, row in enumerate(rows) if row.temperature == 0]
    if greedy:
        index = torch.tensor(greedy, device=logits.device)
        tokens[index] = logits.index_select(0, index).argmax(dim=-1)

    stochastic = [i for i, row in enumerate(rows) if row.temperature != 0]
    if stochastic:
        index = torch.tensor(stochastic, device=logits.device)
        probs = _truncated_probs(logits.index_select(0, index), [rows[i] for i in stochastic])
        uniforms = torch.empty(len(stochastic), dtype=torch.float64, device=logits.device)
        unseeded = [j for j, i in enumerate(stochastic) if rows[i].generator is None]
        if unseeded:
            # A generator draws only on its own device (a CUDA one into a CPU tensor is an error).
            uniforms[unseeded] = torch.rand(
                len(unseeded), dtype=torch.float64, device=shared_generator.device, generator=shared_generator
            )
        for j, i in enumerate(stochastic):
            generator = rows[i].generator
            if generator is not None:
                uniforms[j] = torch.rand(1, dtype=torch.float64, device=generator.device, generator=generator)[0]
        tokens[index] = _inverse_cdf(probs, uniforms)

    chosen_logprobs = raw_logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
    return tokens, chosen_logprobs


def _truncated_probs(logits: torch.Tensor, rows: Sequence[RowSampling]) -> torch.Tensor:
    """Softmax of logits / temperature after each row's top-k and top-p cut."""
    vocab = logits.shape[-1]
    temperatures = torch.tensor([row.temperature for row in rows], device=logits.device).unsqueeze(1)
    scaled = logits / temperatures
    top_ks = [row.top_k if 0 < row.top_k < vocab else vocab for row in rows]
    top_ps = [row.top_p for row in rows]
    if all(k == vocab for k in top_ks) and all(p >= 1.0 for p in top_ps):
        return torch.softmax(scaled, dim=-1)

    sorted_logits, sorted_index = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
    remove = ranks >= torch.tensor(top_ks, device=logits.device).unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    # The most likely token always survives (its mass_before is 0), so no row is left empty.
    remove = mass_before >= torch.tensor(top_ps, device=logits.device).unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    truncated = torch.empty_like(scaled).scatter_(-1, sorted_index, sorted_logits)
    return torch.softmax(truncated, dim=-1)


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Exact draws from each row of `probs` with one uniform number per row.

    Several times faster than `torch.multinomial` on CPU; a token of probability 0 is never picked
    because its cumulative mass equals its predecessor's.
    """
    cdf = probs.double().cumsum(dim=-1)
    targets = (uniforms * cdf[:, -1]).unsqueeze(1)
    return torch.searchsorted(cdf, targets, right=True).squeeze(1).clamp(max=probs.shape[-1] - 1)
