"""The one training step every mode takes, and the look-ahead sampling of the online loop."""

from __future__ import annotations

import asyncio

from datum_helpers import rl_batch

from agl_bridge.train.config import GRPOConfig
from agl_bridge.train.online import SampleAhead
from agl_bridge.train.step import TRAIN_KEYS, grpo_settings, train_step


def test_grpo_settings_follow_the_loss() -> None:
    settings = grpo_settings(GRPOConfig(loss_fn="importance_sampling", tis_cap=2.0, learning_rate=1e-3))
    assert settings.loss_config == {"kl_coef": 0.0, "tis_cap": 2.0} and settings.adam.learning_rate == 1e-3
    ppo = grpo_settings(GRPOConfig(loss_fn="ppo", clip_high_threshold=1.28))
    assert ppo.loss_config == {"kl_coef": 0.0, "clip_low_threshold": 0.8, "clip_high_threshold": 1.28}


def test_a_step_trains_the_whole_batch_once_and_nothing_keeps_the_record_keys(make_client) -> None:
    client = make_client(max_batch_tokens=40)  # several micro-batches inside the one forward_backward
    datums = rl_batch(client, count=5)
    settings = grpo_settings(GRPOConfig())
    metrics = asyncio.run(train_step(client, datums, settings))
    assert metrics["num_datums"] == 5 and metrics["optimizer_step"] == 1 and client.step == 1
    assert metrics["trained_tokens"] == metrics["tokens"] > 0 and metrics["time_forward_backward_s"] > 0
    assert "time_s" not in metrics and set(TRAIN_KEYS) <= metrics.keys()
    empty = asyncio.run(train_step(client, [], settings))
    assert empty == {key: None for key in TRAIN_KEYS} | {"trained_tokens": 0, "time_forward_backward_s": 0.0}
    assert client.step == 1


def test_sampling_runs_ahead_by_max_staleness_and_never_past_the_last_step() -> None:
    started: list[int] = []

    async def sample(step: int) -> list:
        started.append(step)
        await asyncio.sleep(0)
        return [step]

    async def run(max_staleness: int) -> list[list[int]]:
        ahead = SampleAhead(sample, steps=4, max_staleness=max_staleness)
        taken = []
        for step in range(1, 4):  # a resumed run: from step 1
            taken.append(await ahead.take(step))
            taken.append(list(started))
        ahead.cancel()
        return taken

    assert asyncio.run(run(0)) == [[1], [1], [2], [1, 2], [3], [1, 2, 3]]
    started.clear()
    assert asyncio.run(run(2)) == [[1], [1, 2, 3], [2], [1, 2, 3], [3], [1, 2, 3]]
