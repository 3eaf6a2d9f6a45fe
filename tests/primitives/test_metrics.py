"""Logprob-gap statistics and entropy against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from agl_bridge.primitives.metrics import logprob_gap_stats, pearson, token_entropy


def test_gap_stats_by_hand() -> None:
    # trainer - sampler = [0.5, -1.0]
    stats = logprob_gap_stats(torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0]))
    assert stats["logprob_diff_mean"] == pytest.approx(-0.25)
    assert stats["logprob_diff_abs_mean"] == pytest.approx(0.75)
    assert stats["logprob_diff_abs_max"] == pytest.approx(1.0)
    # (e^0.5 + e^-1) / 2 = (1.6487212707001282 + 0.36787944117144233) / 2
    assert stats["ratio_mean"] == pytest.approx(1.0083003559357853, rel=1e-6)
    # probabilities move in opposite directions on two points: correlation -1
    assert stats["prob_pearson"] == pytest.approx(-1.0)


def test_gap_stats_without_tokens_are_nan() -> None:
    stats = logprob_gap_stats(torch.tensor([]), torch.tensor([]))
    assert all(math.isnan(v) for v in stats.values())


def test_pearson_by_hand() -> None:
    assert pearson(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0, 4.0, 6.5])) == pytest.approx(0.9979487157886733)
    assert math.isnan(pearson(torch.tensor([1.0, 1.0]), torch.tensor([0.0, 1.0])))


def test_entropy_by_hand() -> None:
    uniform4 = torch.log(torch.full((4,), 0.25))
    half = torch.log(torch.tensor([0.5, 0.5, 1e-30, 1e-30]))
    assert token_entropy(torch.stack([uniform4, half])).tolist() == pytest.approx([math.log(4), math.log(2)], abs=1e-6)
