"""DPO: preference pairs from JSONL or mined from a store, and a DPO run that learns the preference."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agl_bridge.convert import ConvertOptions
from agl_bridge.errors import ConfigError
from agl_bridge.store import SQLiteStore
from agl_bridge.train.config import config_from_dict
from agl_bridge.train.dpo import pairs_from_jsonl, pairs_from_store
from agl_bridge.train.grpo import GRPOTrainer
from agl_bridge.train.run_log import read_metrics
from agl_bridge.types import AttemptStatus, LLMCall, Reward, RolloutStatus


def _write_pairs(path: Path, count: int = 8) -> Path:
    records = [{"prompt": f"Say you are {n}.", "chosen": f"I'm {n}", "rejected": "No."} for n in range(10, 10 + count)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_jsonl_pairs_train_the_response_only(tmp_path: Path, tiny_tokenizer) -> None:
    (pair,) = pairs_from_jsonl(str(_write_pairs(tmp_path / "p.jsonl", 1)), tiny_tokenizer)
    for datums, text in ((pair.chosen, "I'm 10"), (pair.rejected, "No.")):
        (datum,) = datums
        weights = datum.loss_fn_inputs["weights"]
        trained = [t for t, w in zip(datum.loss_fn_inputs["target_tokens"], weights, strict=True) if w]
        assert tiny_tokenizer.decode(trained).startswith(text) and weights[0] == 0
    (tmp_path / "bad.jsonl").write_text('{"prompt": "x", "chosen": "a"}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl, record 1: expected"):
        pairs_from_jsonl(str(tmp_path / "bad.jsonl"), tiny_tokenizer)
    (tmp_path / "same.jsonl").write_text('{"prompt": "x", "chosen": "a", "rejected": "a"}\n')
    with pytest.raises(ConfigError, match="same text"):
        pairs_from_jsonl(str(tmp_path / "same.jsonl"), tiny_tokenizer)


async def _store_with_groups(path: Path) -> None:
    async with SQLiteStore(path) as store:
        for group, rewards in (("g1", [1.0, 0.0, 0.5]), ("g2", [0.3, 0.3])):
            for index, value in enumerate(rewards):
                rollout_id = f"{group}-{index}"
                await store.create_rollout({"q": group}, group_id=group, rollout_id=rollout_id)
                attempt = await store.start_attempt(rollout_id)
                response = [40 + index, 41 + index]
                call = LLMCall(
                    rollout_id=rollout_id,
                    attempt_id=attempt.attempt_id,
                    model="tiny",
                    prompt_token_ids=[1, 2, 3],
                    response_token_ids=response,
                    response_logprobs=[-0.5, -0.5],
                    token_policy_versions=[0, 0],
                )
                await store.add_llm_call(call)
                await store.add_reward(Reward(rollout_id=rollout_id, attempt_id=attempt.attempt_id, value=value))
                await store.finish_attempt(attempt.attempt_id, AttemptStatus.SUCCEEDED)
                await store.set_rollout_status(rollout_id, RolloutStatus.SUCCEEDED)


def test_store_pairs_are_the_best_and_worst_rollout_of_each_group(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    asyncio.run(_store_with_groups(path))
    pairs = asyncio.run(pairs_from_store(str(path), ConvertOptions()))
    assert len(pairs) == 1, "the group with equal returns gives no pair"
    (chosen,), (rejected,) = pairs[0].chosen, pairs[0].rejected
    assert chosen.model_input + [chosen.loss_fn_inputs["target_tokens"][-1]] == [1, 2, 3, 40, 41]
    assert rejected.model_input + [rejected.loss_fn_inputs["target_tokens"][-1]] == [1, 2, 3, 41, 42]
    assert chosen.loss_fn_inputs["weights"] == [0, 0, 1, 1]


def test_dpo_learns_the_preference(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = config_from_dict(
        {
            "mode": "dpo",
            "dpo": {"data": str(_write_pairs(tmp_path / "pairs.jsonl")), "beta": 0.1},
            "model": str(tiny_model_dir),
            "run_dir": str(tmp_path / "run"),
            "steps": 12,
            "batch_size": 4,
            "learning_rate": 5e-3,
            "checkpoint_every": 6,
            "tensorboard": False,
        }
    )
    GRPOTrainer(config).run()
    records = [r for r in read_metrics(tmp_path / "run") if r["phase"] == "train"]
    assert [r["step"] for r in records] == list(range(1, 13)) and all(r["pairs"] == 4 for r in records)
    first, last = records[0], records[-1]
    assert first["margin"] == pytest.approx(0.0, abs=1e-4), "the first step starts at the reference"
    assert last["accuracy"] == 1.0 and last["margin"] > 0.5 and last["dpo_loss"] < first["dpo_loss"] - 0.2, records
    assert last["chosen_reward"] > last["rejected_reward"]
    assert (tmp_path / "run" / "final_adapter" / "adapter_config.json").is_file()
    assert (tmp_path / "run" / "checkpoints" / "step_000012").is_dir()
