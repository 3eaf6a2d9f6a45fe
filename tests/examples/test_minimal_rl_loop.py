"""examples/minimal_rl_loop.py runs on the tiny model and does what an RL loop must: the reward rises,
the trainer scores exactly what the sampler sampled, and each trained step publishes one new policy."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "minimal_rl_loop.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("minimal_rl_loop", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_reward_is_the_share_of_digits() -> None:
    get_reward = _example().get_reward
    assert (get_reward("42"), get_reward("4 2"), get_reward("no"), get_reward("")) == (1.0, 2 / 3, 0.0, 0.0)


def test_the_loop_learns_the_toy_task_on_policy(tiny_model_dir: Path) -> None:
    example = _example()
    history = asyncio.run(example.main(example.Config(model=str(tiny_model_dir))))

    rewards = [h["reward_mean"] for h in history]
    assert len(history) == example.Config.steps
    assert rewards[0] < 0.1, "a random model rarely replies with digits"
    assert min(rewards[-3:]) > 0.8, rewards
    trained = [h for h in history if h["datums"]]
    assert trained and trained[0]["step"] == 1
    for record in trained:  # a fresh sampling client every step: the data is on-policy
        assert abs(record["ratio_mean"] - 1.0) < 1e-3 and record["logprob_diff_abs_max"] < 1e-3, record
    versions = [h["policy_version"] for h in history]
    assert versions == [1 + sum(1 for h in history[: i + 1] if h["datums"]) for i in range(len(history))], versions
