"""The learning-rate schedule: its shapes, the config keys that choose it, and their checks."""

from __future__ import annotations

import math

import pytest

from agl_bridge.train.config import ConfigError, config_from_dict
from agl_bridge.train.schedule import scheduled_learning_rate


def test_constant_is_the_default_and_ignores_the_final_ratio() -> None:
    config = config_from_dict({"steps": 10, "learning_rate": 2e-3, "lr_final_ratio": 0.5})
    assert [config.learning_rate_at(step) for step in range(10)] == [2e-3] * 10


def test_linear_falls_from_the_base_towards_the_final_ratio() -> None:
    rates = [scheduled_learning_rate(1.0, step, 4, schedule="linear", final_ratio=0.2) for step in range(4)]
    assert rates == pytest.approx([1.0, 0.8, 0.6, 0.4])


def test_cosine_starts_at_the_base_passes_the_midpoint_and_ends_near_the_floor() -> None:
    rates = [scheduled_learning_rate(1.0, step, 100, schedule="cosine", final_ratio=0.1) for step in range(100)]
    assert rates[0] == 1.0 and rates[50] == pytest.approx(0.55)
    assert rates[-1] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.99)))
    assert all(later <= earlier for earlier, later in zip(rates, rates[1:], strict=False))


def test_warmup_rises_linearly_then_the_decay_spans_the_remaining_steps() -> None:
    rates = [scheduled_learning_rate(1.0, step, 6, schedule="linear", warmup_steps=2) for step in range(6)]
    assert rates == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25])


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"lr_schedule": "step"}, "lr_schedule must be one of constant, linear, cosine"),
        ({"steps": 5, "lr_warmup_steps": 5}, r"lr_warmup_steps must be an integer in \[0, steps\)"),
        ({"lr_warmup_steps": -1}, "lr_warmup_steps must be"),
        ({"lr_final_ratio": 1.5}, r"lr_final_ratio must be in \[0, 1\]"),
        ({"lr_final_ratio": "low"}, "lr_final_ratio must be a finite number"),
    ],
)
def test_schedule_keys_are_checked_by_name(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_dict(raw)
