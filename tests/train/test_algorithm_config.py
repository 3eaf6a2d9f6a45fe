"""The algorithm keys of the run config: each selectable, defaults unchanged, bad names and combinations named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agl_bridge.train.config import ConfigError, config_from_dict, load_config
from agl_bridge.train.step import grpo_settings

JUDGE = {"model": "tiny", "rubric": "short answers win"}


@pytest.mark.parametrize(
    ("raw", "keys"),
    [
        ({"loss_fn": "gspo", "rollout_correction": "token"}, ["loss_fn", "rollout_correction"]),
        ({"loss_fn": "ppo", "mis_high": 2.0}, ["mis_high", "rollout_correction"]),
        ({"loss_fn": "cispo", "geo_low": 0.99}, ["geo_low", "rollout_correction"]),
        ({"rollout_correction": "sequence", "tis_cap": None}, ["rollout_correction", "tis_cap"]),
        ({"advantage": "rloo", "advantage_std_scaling": True}, ["advantage_std_scaling", "advantage"]),
        ({"advantage": "dr_grpo", "aggregation": "token_mean"}, ["advantage", "aggregation"]),
        ({"teacher": "tiny", "judge": JUDGE}, ["teacher", "judge"]),
        ({"teacher": "tiny", "advantage": "rloo"}, ["teacher", "advantage"]),
        ({"teacher": "tiny", "overlong_penalty": {"max_tokens": 8, "buffer": 2}}, ["teacher", "overlong_penalty"]),
        ({"teacher": "tiny", "offline_data": "x.jsonl"}, ["teacher", "offline_data"]),
        ({"judge": JUDGE, "offline_data": "x.jsonl"}, ["judge", "offline_data"]),
        ({"mode": "dpo"}, ["mode", "dpo.data"]),
        ({"mode": "dpo", "dpo": {"data": "p.jsonl"}, "teacher": "tiny"}, ["mode", "teacher"]),
        ({"mode": "dpo", "dpo": {"data": "p.jsonl", "beta": 0}}, ["dpo.beta"]),
        ({"judge": {"model": "nobody", "rubric": "r"}}, ["judge.model", "nobody", "tiny"]),
        ({"judge": {"model": "tiny"}}, ["judge", "rubric"]),
        ({"judge": {"modl": "tiny"}}, ["judge.modl"]),
        ({"judge": "tiny"}, ["judge must be a table"]),
        ({"overlong_penalty": {"max_tokens": 10, "buffer": 20}}, ["overlong_penalty", "buffer"]),
        ({"repetition_penalty": {"threshold": 1.5}}, ["repetition_penalty", "threshold"]),
        ({"mis_low": 2.0, "rollout_correction": "token"}, ["mis_low"]),
        ({"geo_high": 0.5}, ["geo_high"]),
        ({"advantage": "ranked"}, ["advantage must be one of"]),
        ({"rollout_correction": "tokens"}, ["rollout_correction must be one of"]),
        ({"mode": "rlhf"}, ["mode must be one of"]),
        ({"loss_fn": "grpo"}, ["loss_fn must be one of", "gspo"]),
        ({"lora_target_modules": 3}, ["lora_target_modules"]),
        ({"lora_target_modules": ["q_proj", ""]}, ["lora_target_modules"]),
        ({"teacher": ""}, ["teacher"]),
    ],
)
def test_bad_settings_and_combinations_name_their_keys(raw: dict[str, Any], keys: list[str]) -> None:
    with pytest.raises(ConfigError) as refused:
        config_from_dict(raw)
    for key in keys:
        assert key in str(refused.value), (key, str(refused.value))


def test_defaults_are_unchanged() -> None:
    config = config_from_dict({})
    assert (config.mode, config.loss_fn, config.advantage, config.rollout_correction) == (
        "online",
        "importance_sampling",
        "group_mean",
        None,
    )
    assert config.lora_target_modules == "all-linear" and config.tis_cap == 2.0
    assert grpo_settings(config).loss_config == {"kl_coef": 0.0, "tis_cap": 2.0}
    assert grpo_settings(config_from_dict({"loss_fn": "cispo"})).loss_config == {
        "kl_coef": 0.0,
        "clip_low_threshold": 0.8,
        "clip_high_threshold": 1.28,
    }


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"loss_fn": "gspo"}, {"kl_coef": 0.0, "clip_low_threshold": 1 - 3e-4, "clip_high_threshold": 1 + 4e-4}),
        (
            {"loss_fn": "gspo", "rollout_correction": "sequence", "geo_low": 0.99, "clip_high_threshold": 1.001},
            {
                "kl_coef": 0.0,
                "correction_level": "sequence",
                "tis_cap": 2.0,
                "geo_low": 0.99,
                "clip_low_threshold": 1 - 3e-4,
                "clip_high_threshold": 1.001,
            },
        ),
        (
            {"rollout_correction": "sequence", "tis_cap": None, "mis_low": 0.5, "mis_high": 2.0},
            {"kl_coef": 0.0, "correction_level": "sequence", "mis_low": 0.5, "mis_high": 2.0},
        ),
        ({"geo_low": 0.9, "geo_high": 1.1}, {"kl_coef": 0.0, "tis_cap": 2.0, "geo_low": 0.9, "geo_high": 1.1}),
        (
            {"loss_fn": "ppo", "rollout_correction": "token", "tis_cap": 3.0},
            {
                "kl_coef": 0.0,
                "correction_level": "token",
                "tis_cap": 3.0,
                "clip_low_threshold": 0.8,
                "clip_high_threshold": 1.28,
            },
        ),
    ],
)
def test_each_loss_and_correction_is_selectable(raw: dict[str, Any], expected: dict[str, Any]) -> None:
    settings = grpo_settings(config_from_dict(raw))
    assert settings.loss_config == pytest.approx(expected)
    from agl_bridge.primitives.losses import get_loss, resolve_config

    resolve_config(get_loss(str(settings.loss_fn)), settings.loss_config)  # the loss accepts what the run passes


def test_tables_load_from_toml_with_paths_next_to_the_config(tmp_path: Path) -> None:
    (tmp_path / "judges.yaml").write_text(
        "model_list:\n  - model_name: judge\n    litellm_params: {model: openai/judge, mock_response: '{}'}\n"
    )
    (tmp_path / "run.toml").write_text(
        'agent = "a.py:f"\ntasks = "t.jsonl"\nlitellm_config = "judges.yaml"\nadvantage = "rloo"\n'
        '[judge]\nmodel = "judge"\nrubric = "be right"\n'
        "[overlong_penalty]\nmax_tokens = 64\nbuffer = 16\n[repetition_penalty]\nngram = 3\n"
    )
    config = load_config(tmp_path / "run.toml")
    assert config.judge is not None and config.judge.model == "judge" and config.judge.max_retries == 2
    assert config.overlong_penalty is not None and config.overlong_penalty.buffer == 16
    assert config.repetition_penalty is not None and config.repetition_penalty.threshold == 0.3
    (tmp_path / "dpo.toml").write_text('mode = "dpo"\n[dpo]\ndata = "pairs.jsonl"\nbeta = 0.2\n')
    dpo = load_config(tmp_path / "dpo.toml")
    assert dpo.dpo.data == str(tmp_path / "pairs.jsonl") and dpo.dpo.beta == 0.2
