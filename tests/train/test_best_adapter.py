"""keep_best: the adapter of the best validation reward is kept on disk, restored at the end, kept across resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from datum_helpers import rl_batch

from agl_bridge.errors import ConfigError
from agl_bridge.primitives import AdamParams
from agl_bridge.train.best_adapter import BestAdapter, KeptAdapter
from agl_bridge.train.config import GRPOConfig
from agl_bridge.train.grpo import GRPOTrainer


def _adapter(client) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in client.model.named_parameters() if "lora_" in k}


def _train_one_step(client) -> None:
    client.forward_backward(rl_batch(client, count=2), "importance_sampling")
    client.optim_step(AdamParams(learning_rate=5e-2))


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_best_validation_reward_is_kept_and_restored_ties_keep_the_later(make_client, tmp_path: Path) -> None:
    client = make_client()
    best = BestAdapter(tmp_path, resume=False)
    assert best.offer(client, step=0, validation_reward=None, held_out_reward=0.1) is False  # no reward: no candidate
    assert best.offer(client, step=0, validation_reward=0.2, held_out_reward=0.1)
    _train_one_step(client)
    assert best.offer(client, step=10, validation_reward=0.5, held_out_reward=0.4)
    _train_one_step(client)
    assert best.offer(client, step=20, validation_reward=0.5, held_out_reward=0.9)  # a tie: the later is kept
    at_step_20 = _adapter(client)
    _train_one_step(client)
    assert best.offer(client, step=30, validation_reward=0.3, held_out_reward=0.9) is False
    assert not _same(_adapter(client), at_step_20)

    kept = best.restore(client)
    assert kept == KeptAdapter(step=20, validation_reward=0.5, held_out_reward=0.9)
    assert _same(_adapter(client), at_step_20)


def test_a_resumed_run_keeps_its_best_and_a_fresh_run_forgets_an_old_one(make_client, tmp_path: Path) -> None:
    client = make_client()
    BestAdapter(tmp_path, resume=False).offer(client, step=10, validation_reward=0.5, held_out_reward=0.4)
    resumed = BestAdapter(tmp_path, resume=True)
    assert resumed.kept == KeptAdapter(step=10, validation_reward=0.5, held_out_reward=0.4)
    assert resumed.offer(client, step=20, validation_reward=0.4, held_out_reward=0.9) is False

    fresh = BestAdapter(tmp_path, resume=False)
    assert fresh.kept is None and not fresh.path.exists()
    assert fresh.restore(client) is None


def test_keep_best_needs_validation_tasks_and_an_online_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="keep_best needs validation tasks"):
        GRPOTrainer(GRPOConfig(keep_best=True, run_dir=str(tmp_path)), agent=lambda task, endpoint: 0.0, tasks=[1, 2])
    with pytest.raises(
        ConfigError, match='keep_best is a setting of an online run; this run is a follow run.*mode = "follow"'
    ):
        GRPOConfig(keep_best=True, mode="follow").validate()
    with pytest.raises(ConfigError, match="keep_best is a setting of an online run; this run is an offline run"):
        GRPOConfig(keep_best=True, offline_data="runs/x/store.sqlite").validate()
