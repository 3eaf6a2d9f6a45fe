"""Advantage estimators and the datums that carry them, against references written with explicit loops."""

from __future__ import annotations

import math

import pytest
from algo_helpers import random_trajectories

from agl_bridge.primitives.advantages import constant_divisor
from agl_bridge.train.advantages import group_advantages
from agl_bridge.train.datums import datums_for

TOLERANCE = 1e-6


def reference_advantages(trajectories, estimator: str) -> dict[str, float]:
    """By rollout id, from the definitions: leave-one-out means summed by hand, population std by hand."""
    groups: dict[str, list] = {}
    for t in trajectories:
        groups.setdefault(t.group_id, []).append(t)
    out = {}
    for members in groups.values():
        n = len(members)
        mean = sum(t.reward for t in members) / n
        std = math.sqrt(sum((t.reward - mean) ** 2 for t in members) / n)
        if std < 1e-6:
            continue
        for t in members:
            if estimator == "rloo":
                others = [o.reward for o in members if o is not t]
                out[t.rollout_id] = t.reward - sum(others) / len(others)
            elif estimator == "mean_std":
                out[t.rollout_id] = (t.reward - mean) / (std + 1e-6)
            else:  # group_mean and dr_grpo take the same advantage; Dr. GRPO differs in normalisation
                out[t.rollout_id] = t.reward - mean
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("estimator", ["group_mean", "mean_std", "rloo", "dr_grpo"])
def test_estimators_match_the_definitions(seed: int, estimator: str) -> None:
    trajectories = random_trajectories(seed)
    batch = group_advantages(trajectories, estimator=estimator)
    expected = reference_advantages(trajectories, estimator)
    assert {t.rollout_id: a for t, a in batch.items} == pytest.approx(expected, abs=TOLERANCE)
    assert batch.trajectories == len(trajectories)
    assert batch.groups == 4 and batch.groups_dropped_zero_variance == 2  # the group of one and the flat group


def test_std_scaling_flag_is_the_mean_std_estimator_and_refuses_others() -> None:
    trajectories = random_trajectories(1)
    flag = group_advantages(trajectories, std_scaling=True)
    named = group_advantages(trajectories, estimator="mean_std")
    assert [a for _, a in flag.items] == [a for _, a in named.items]
    with pytest.raises(ValueError, match="rloo"):
        group_advantages(trajectories, estimator="rloo", std_scaling=True)
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        group_advantages(trajectories, estimator="ppo")


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("aggregation", ["token_sum", "token_mean", "sequence_mean"])
@pytest.mark.parametrize("per_token", [False, True])
def test_datums_scale_by_the_aggregation_on_sampled_tokens_only(seed: int, aggregation: str, per_token: bool) -> None:
    trajectories = random_trajectories(seed)
    divisor = 37.0 if aggregation == "token_sum" else 1.0  # Dr. GRPO's constant with its only aggregation
    items = []
    for i, t in enumerate(trajectories):
        if per_token:
            items.append((t, [[(i + 1) * 0.1 * (k % 3 - 1) for k in range(len(s.input_ids))] for s in t.segments]))
        else:
            items.append((t, (i - 3) * 0.25))
    datums = datums_for(items, aggregation, divisor=divisor)

    segments = [(s, a if not per_token else a[k]) for t, a in items for k, s in enumerate(t.segments)]
    total = sum(sum(s.loss_mask[1:]) for s, _ in segments)
    assert len(datums) == len(segments)
    for datum, (segment, advantage) in zip(datums, segments, strict=True):
        trained = sum(segment.loss_mask[1:])
        for position in range(len(segment.input_ids) - 1):
            token = position + 1  # datum position i predicts token i + 1
            raw = advantage[token] if per_token else advantage
            if aggregation == "token_mean":
                raw = raw / total
            elif aggregation == "sequence_mean":
                raw = raw / (trained * len(segments))
            raw = raw / divisor
            expected = raw if segment.loss_mask[token] else 0.0
            assert datum.loss_fn_inputs["advantages"][position] == pytest.approx(expected, abs=TOLERANCE)
            assert datum.loss_fn_inputs["weights"][position] == segment.loss_mask[token]
            if segment.loss_mask[token]:
                assert datum.loss_fn_inputs["logprobs"][position] == segment.sampler_logprobs[token]


def test_default_datums_are_bit_identical_to_the_plain_formula() -> None:
    """Defaults unchanged: token_sum multiplies each mask by A; token_mean divides A by the tokens first."""
    trajectories = random_trajectories(7)
    items = [(t, 0.1 * (i + 1)) for i, t in enumerate(trajectories)]
    total = sum(sum(s.loss_mask[1:]) for t in trajectories for s in t.segments)
    for aggregation, scale in (("token_sum", None), ("token_mean", total)):
        datums = datums_for(items, aggregation)
        expected = [
            [(a if scale is None else a / scale) * m for m in s.loss_mask[1:]] for t, a in items for s in t.segments
        ]
        assert [d.loss_fn_inputs["advantages"] for d in datums] == expected


def test_dr_grpo_divisor_is_a_constant_of_the_step() -> None:
    assert constant_divisor("dr_grpo", 12, 256) == 12 * 256
    assert constant_divisor("group_mean", 12, 256) == 1.0
    assert constant_divisor("dr_grpo", 0, 256) == 256


def test_a_non_finite_advantage_is_refused() -> None:
    trajectory = random_trajectories(0)[0]
    with pytest.raises(ValueError, match="not finite"):
        datums_for([(trajectory, [[math.nan] * len(s.input_ids) for s in trajectory.segments])], "token_sum")
